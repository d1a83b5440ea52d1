"""An Anthropic candidate for experiments: the recorded OpenAI-style prompt converted to the Messages API
and the answer converted back.

The tape keeps every prompt in one shape (OpenAI chat messages, ``recorded_request``); Claude takes
another: the system prompt apart, tool calls as ``tool_use`` blocks, tool results as ``tool_result``
blocks in a user turn, tools with an ``input_schema``, ``max_tokens`` required. ``to_anthropic`` maps a
chat request to ``messages.create`` arguments, ``from_anthropic`` maps the Message back to a chat
completion, and ``AnthropicChat`` is an OpenAI-shaped client over the Anthropic SDK (so a program-level
experiment's program can keep calling ``client.chat.completions.create``).
"""

from __future__ import annotations

import json
import time
from typing import Any

DEFAULT_MAX_TOKENS = 1024  # the Messages API requires one; a recorded prompt without it gets this
_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
         "pause_turn": "stop", "refusal": "content_filter"}
_DROPPED = ("seed", "frequency_penalty", "presence_penalty", "n", "logprobs", "top_logprobs", "user",
            "response_format", "parallel_tool_calls", "stream_options", "store", "metadata", "stream")


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    return json.dumps(content, ensure_ascii=False)


def _image_block(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        head, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": head or "image/png", "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        out: list[dict[str, Any]] = []
        for p in content:
            if not isinstance(p, dict):
                continue
            if p.get("type") == "text":
                out.append({"type": "text", "text": p.get("text") or ""})
            elif p.get("type") == "image_url":
                url = p.get("image_url")
                out.append(_image_block(url.get("url", "") if isinstance(url, dict) else str(url or "")))
        return out
    text = _text_of(content)
    return [{"type": "text", "text": text}] if text else []


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except ValueError:
            return {"_raw": value}  # Claude takes an object; a malformed recorded argument string is kept whole
    return value if isinstance(value, dict) else {}


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice in (None, "auto"):
        return {"type": "auto"} if choice else None
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        if name:
            return {"type": "tool", "name": name}
    return None


def to_anthropic(request: dict[str, Any]) -> dict[str, Any]:
    """``messages.create`` arguments for an OpenAI-style chat request: system apart, tool calls as
    ``tool_use``, tool results as ``tool_result`` blocks in a user turn, consecutive turns of one role merged."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": list(blocks)})

    for m in request.get("messages") or []:
        role = m.get("role")
        if role in ("system", "developer"):
            text = _text_of(m.get("content"))
            if text:
                system.append(text)
        elif role == "assistant":
            blocks = [{"type": "text", "text": t} for t in [_text_of(m.get("content"))] if t]
            for c in m.get("tool_calls") or []:
                fn = c.get("function") or {}
                blocks.append({"type": "tool_use", "id": c.get("id") or f"toolu_{len(blocks)}",
                               "name": fn.get("name") or "", "input": _arguments(fn.get("arguments"))})
            add("assistant", blocks)
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id") or "",
                          "content": _text_of(m.get("content"))}])
        else:
            add("user", _user_blocks(m.get("content")))
    out: dict[str, Any] = {"model": request.get("model"), "messages": turns,
                           "max_tokens": int(request.get("max_tokens") or request.get("max_completion_tokens")
                                             or DEFAULT_MAX_TOKENS)}
    if system:
        out["system"] = "\n\n".join(system)
    tools = [t.get("function") or t for t in request.get("tools") or [] if isinstance(t, dict)]
    if tools:
        out["tools"] = [{"name": t.get("name") or "", **({"description": t["description"]} if t.get("description") else {}),
                         "input_schema": t.get("parameters") or {"type": "object", "properties": {}}} for t in tools]
    choice = _tool_choice(request.get("tool_choice"))
    if choice is not None:
        out["tool_choice"] = choice
    for key in ("temperature", "top_p"):
        if request.get(key) is not None:
            out[key] = request[key]
    stop = request.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return out


def from_anthropic(message: Any) -> dict[str, Any]:
    """An Anthropic Message (object or dict) as an OpenAI chat completion: text joined, ``tool_use``
    blocks as tool calls, the stop reason and usage mapped (cache reads and writes count as prompt tokens)."""
    raw = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    blocks = raw.get("content") or []
    text = "".join(b.get("text") or "" for b in blocks if b.get("type") == "text")
    calls = [{"id": b.get("id"), "type": "function",
              "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}}
             for b in blocks if b.get("type") == "tool_use"]
    reply: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        reply["tool_calls"] = calls
    usage = raw.get("usage") or {}
    cache_read = usage.get("cache_read_input_tokens") or 0
    prompt = (usage.get("input_tokens") or 0) + cache_read + (usage.get("cache_creation_input_tokens") or 0)
    completion = usage.get("output_tokens") or 0
    return {"id": raw.get("id") or "", "object": "chat.completion", "created": int(time.time()),
            "model": raw.get("model") or "",
            "choices": [{"index": 0, "message": reply, "logprobs": None,
                         "finish_reason": _STOP.get(raw.get("stop_reason") or "end_turn", "stop")}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cache_read}}}


class _Completions:
    def __init__(self, owner: AnthropicChat) -> None:
        self._owner = owner

    def create(self, **request: Any) -> Any:
        """An OpenAI-style chat request answered by Claude, as a ``ChatCompletion`` (a dict without openai)."""
        for key in _DROPPED:
            request.pop(key, None)
        doc = from_anthropic(self._owner.messages.create(**to_anthropic(request)))
        try:
            from openai.types.chat import ChatCompletion
        except ImportError:  # pragma: no cover - openai is installed beside anthropic in practice
            return doc
        return ChatCompletion.model_validate(doc)


class _Chat:
    def __init__(self, owner: AnthropicChat) -> None:
        self.completions = _Completions(owner)


class AnthropicChat:
    """The Anthropic SDK client with an OpenAI face: ``messages.create`` as the SDK has it (what a
    node-level experiment records), ``chat.completions.create`` converting both ways (what a program uses)."""

    def __init__(self, client: Any) -> None:
        self.anthropic = client
        self.messages = client.messages
        self.chat = _Chat(self)


def anthropic_client(base_url: str | None, api_key: str | None, timeout: float) -> AnthropicChat:
    """``AnthropicChat`` over ``anthropic.Anthropic`` (no retries: a failed call is the experiment's to retry)."""
    try:
        import anthropic
    except ImportError:
        from .experiment import ExperimentError

        raise ExperimentError("--provider anthropic needs the Anthropic SDK: pip install 'otel-agenttape[anthropic]'") from None
    return AnthropicChat(anthropic.Anthropic(base_url=base_url, api_key=api_key or "unused", max_retries=0,
                                             timeout=timeout))
