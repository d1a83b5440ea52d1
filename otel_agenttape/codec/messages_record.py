"""Convert OpenAI / Anthropic / Gemini message shapes into the GenAI message schema, as capture records them.

GenAI schema: ``{"role": ..., "parts": [{"type": "text", "content": ...}, ...]}`` with part types
``text``, ``reasoning``, ``tool_call`` (id, name, arguments), ``tool_call_response`` (id, ``response``),
``blob`` (modality, mime_type, content base64), ``uri`` (modality, uri), ``file``; anything else is kept
as a generic part with its ``type``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .jsontext import parse_structured_json, payload_text, to_plain

_FINISH_MAP = {
    "tool_calls": "tool_call",
    "function_call": "tool_call",
    "tool_use": "tool_call",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "refusal": "content_filter",
}


def map_finish_reason(reason: Any) -> str | None:
    """Provider finish/stop reason -> GenAI finish reason."""
    if reason is None:
        return None
    text = str(reason)
    return _FINISH_MAP.get(text, text.lower() if text.isupper() else text)


def _text(content: str) -> dict[str, Any]:
    return {"type": "text", "content": content}


def _modality(mime: str | None, default: str = "image") -> str:
    if not mime:
        return default
    head = mime.split("/", 1)[0]
    if head in ("image", "video", "audio"):
        return head
    return "document"


def _data_url_part(url: str) -> dict[str, Any]:
    # data:<mime>;base64,<data>
    header, _, data = url.partition(",")
    mime = header[5:].split(";", 1)[0] or None
    part: dict[str, Any] = {"type": "blob", "modality": _modality(mime), "content": data}
    if mime:
        part["mime_type"] = mime
    return part


def _source_part(source: Mapping[str, Any], default_modality: str) -> dict[str, Any]:
    kind = source.get("type")
    mime = source.get("media_type")
    if kind == "base64":
        part = {"type": "blob", "modality": _modality(mime, default_modality), "content": source.get("data")}
    elif kind == "url":
        part = {"type": "uri", "modality": _modality(mime, default_modality), "uri": source.get("url")}
    elif kind == "file":
        part = {"type": "file", "modality": default_modality, "file_id": source.get("file_id")}
    elif kind == "text":
        return _text(source.get("data", ""))
    else:
        return {"type": "generic", **dict(source)}
    if mime:
        part["mime_type"] = mime
    return part


def convert_part(part: Any) -> dict[str, Any]:
    """One content part of any supported SDK shape -> one GenAI part."""
    out = _convert_part(part)
    if out.get("type") in ("tool_call", "tool_call_response") and out.get("id") is None:
        out.pop("id", None)  # optional in the schema: omit rather than write null
    return out


def _convert_part(part: Any) -> dict[str, Any]:
    part = to_plain(part)
    if isinstance(part, str):
        return _text(part)
    if not isinstance(part, Mapping):
        return _text(str(part))
    kind = part.get("type")
    if kind == "text":
        if "content" in part and "text" not in part:  # already GenAI
            return dict(part)
        return _text(part.get("text", ""))
    if kind in ("input_text", "output_text"):  # OpenAI Responses API
        return _text(part.get("text", ""))
    if kind == "refusal":
        return _text(part.get("refusal", ""))
    if kind == "image_url":
        image = part.get("image_url") or {}
        url = image.get("url", "") if isinstance(image, Mapping) else str(image)
        if url.startswith("data:"):
            return _data_url_part(url)
        return {"type": "uri", "modality": "image", "uri": url}
    if kind == "input_audio":
        audio = part.get("input_audio") or {}
        fmt = audio.get("format")
        out = {"type": "blob", "modality": "audio", "content": audio.get("data")}
        if fmt:
            out["mime_type"] = f"audio/{fmt}"
        return out
    if kind in ("image", "document") and isinstance(part.get("source"), Mapping):
        return _source_part(part["source"], "image" if kind == "image" else "document")
    if kind == "tool_use":  # Anthropic
        return {"type": "tool_call", "id": part.get("id"), "name": part.get("name"), "arguments": part.get("input")}
    if kind == "tool_result":  # Anthropic
        content = part.get("content")
        if isinstance(content, list):
            content = [convert_part(p) for p in content]
        out = {"type": "tool_call_response", "id": part.get("tool_use_id"), "response": content}
        if part.get("is_error"):
            out["is_error"] = True
        return out
    if kind == "thinking":  # Anthropic extended thinking
        return {"type": "reasoning", "content": part.get("thinking", "")}
    if kind == "reasoning" and "content" in part:
        return dict(part)
    if kind == "function_call" and "name" in part:  # OpenAI Responses API
        return {"type": "tool_call", "id": part.get("call_id"), "name": part.get("name"),
                "arguments": parse_structured_json(part.get("arguments"))}
    if kind == "function_call_output":
        return {"type": "tool_call_response", "id": part.get("call_id"), "response": part.get("output")}
    if kind is None:
        # Gemini parts
        if "text" in part:
            return {"type": "reasoning", "content": part["text"]} if part.get("thought") else _text(part["text"])
        if "functionCall" in part or "function_call" in part:
            call = part.get("functionCall") or part.get("function_call") or {}
            return {"type": "tool_call", "id": call.get("id"), "name": call.get("name"),
                    "arguments": call.get("args")}
        if "functionResponse" in part or "function_response" in part:
            resp = part.get("functionResponse") or part.get("function_response") or {}
            return {"type": "tool_call_response", "id": resp.get("id") or resp.get("name"),
                    "response": resp.get("response")}
        if "inlineData" in part or "inline_data" in part:
            data = part.get("inlineData") or part.get("inline_data") or {}
            mime = data.get("mimeType") or data.get("mime_type")
            return {"type": "blob", "modality": _modality(mime), "mime_type": mime, "content": data.get("data")}
        if "fileData" in part or "file_data" in part:
            data = part.get("fileData") or part.get("file_data") or {}
            mime = data.get("mimeType") or data.get("mime_type")
            return {"type": "uri", "modality": _modality(mime), "mime_type": mime,
                    "uri": data.get("fileUri") or data.get("file_uri")}
        return {"type": "generic", **dict(part)}
    return dict(part)


def _tool_call_part(call: Any) -> dict[str, Any]:
    call = to_plain(call)
    if not isinstance(call, Mapping):
        return {"type": "tool_call", "name": str(call)}
    function = call.get("function")
    if isinstance(function, Mapping):
        name, arguments = function.get("name"), function.get("arguments")
    else:
        name, arguments = call.get("name"), call.get("arguments", call.get("input", call.get("args")))
    out = {"type": "tool_call", "id": call.get("id") or call.get("call_id"), "name": name,
           "arguments": parse_structured_json(arguments)}
    if out["id"] is None:
        del out["id"]
    return out


def convert_message(message: Any) -> dict[str, Any]:
    """One chat message (OpenAI, Anthropic, Gemini or already GenAI) -> GenAI ChatMessage."""
    if type(message) is dict and type(message.get("content")) is str:
        size = len(message)
        role = message.get("role")
        if size == 2 and role is not None and role != "model":  # fast path: {"role": ..., "content": "text"}
            content = message["content"]
            return {"role": role, "parts": [{"type": "text", "content": content}] if content else []}
        if size == 3 and role == "tool" and "tool_call_id" in message:  # fast path: OpenAI tool message
            return {"role": "tool", "parts": [{"type": "tool_call_response", "id": message["tool_call_id"],
                                               "response": message["content"]}]}
    message = to_plain(message)
    if isinstance(message, str):
        return {"role": "user", "parts": [_text(message)]}
    if not isinstance(message, Mapping):
        return {"role": "user", "parts": [_text(str(message))]}
    role = message.get("role") or "user"
    if role == "model":  # Gemini
        role = "assistant"
    parts: list[dict[str, Any]] = []
    if role == "tool" and "tool_call_id" in message:  # OpenAI tool message
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content)
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content})
    else:
        raw_parts = message.get("parts")
        content = message.get("content")
        if isinstance(raw_parts, list):
            parts.extend(convert_part(p) for p in raw_parts)
        elif isinstance(content, str):
            if content:
                parts.append(_text(content))
        elif isinstance(content, list):
            parts.extend(convert_part(p) for p in content)
        elif content is not None:
            parts.append(convert_part(content))
        if message.get("reasoning_content"):
            parts.insert(0, {"type": "reasoning", "content": message["reasoning_content"]})
        for call in message.get("tool_calls") or ():
            parts.append(_tool_call_part(call))
        function_call = message.get("function_call")
        if isinstance(function_call, Mapping):
            parts.append(_tool_call_part(function_call))
    out: dict[str, Any] = {"role": role, "parts": parts}
    if message.get("name"):
        out["name"] = message["name"]
    return out


def convert_messages(messages: Any) -> list[dict[str, Any]]:
    """A message list (or a single prompt string) -> GenAI input messages."""
    messages = to_plain(messages)
    if messages is None:
        return []
    if type(messages) is not list and isinstance(messages, (str, Mapping)):
        messages = [messages]
    return [convert_message(m) for m in messages]


def as_messages(value: Any, role: str) -> list[dict[str, Any]]:
    """A run's input or output: chat messages as GenAI messages, anything else as one ``role`` text message
    (strings verbatim, other values as JSON text)."""
    value = to_plain(value)
    if isinstance(value, list) and all(isinstance(m, Mapping) and "role" in m for m in value):
        return convert_messages(value)
    if isinstance(value, Mapping) and "role" in value:
        return convert_messages([value])
    content = value if isinstance(value, str) else payload_text(value)
    return [{"role": role, "parts": [{"type": "text", "content": content}]}]


def system_instructions(system: Any) -> list[dict[str, Any]]:
    """Anthropic ``system=`` / Gemini ``system_instruction`` -> GenAI system instruction parts."""
    system = to_plain(system)
    if system is None:
        return []
    if isinstance(system, str):
        return [_text(system)]
    if isinstance(system, Mapping):
        if "parts" in system:
            return [convert_part(p) for p in system["parts"]]
        return [convert_part(system)]
    return [convert_part(p) for p in system]


def tool_definitions(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """OpenAI / Anthropic tool definitions -> GenAI tool definitions (``messages_read.tool_definitions`` reads
    them back)."""
    out = []
    for tool in tools:
        tool = to_plain(tool)
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        if isinstance(function, Mapping):
            entry = {"type": "function", "name": function.get("name")}
            if function.get("description"):
                entry["description"] = function["description"]
            if function.get("parameters") is not None:
                entry["parameters"] = function["parameters"]
        elif "input_schema" in tool:
            entry = {"type": "function", "name": tool.get("name")}
            if tool.get("description"):
                entry["description"] = tool["description"]
            entry["parameters"] = tool["input_schema"]
        else:
            entry = dict(tool)
            entry.setdefault("type", "function")
        out.append(entry)
    return out


def describe_response(raw: Any) -> dict[str, Any]:
    """Pull text, tool calls, finish reason, model and id out of a raw (non-streamed) response."""
    raw = to_plain(raw)
    info: dict[str, Any] = {"text": None, "reasoning": None, "tool_calls": [], "finish_reason": None,
                            "model": None, "id": None}
    if type(raw) is not dict and not isinstance(raw, Mapping):
        return info
    if raw.get("type") == "message_start" and isinstance(raw.get("message"), Mapping):
        raw = raw["message"]
    info["model"] = raw.get("model") or raw.get("modelVersion")
    info["id"] = raw.get("id") or raw.get("responseId")
    choices = raw.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):  # OpenAI chat
        choice = choices[0]
        message = choice.get("message") or choice.get("delta") or {}
        if type(message) is dict or isinstance(message, Mapping):
            content = message.get("content")
            if isinstance(content, str):
                info["text"] = content
            if message.get("reasoning_content"):
                info["reasoning"] = message["reasoning_content"]
            info["tool_calls"] = [_tool_call_part(c) for c in message.get("tool_calls") or ()]
        info["finish_reason"] = map_finish_reason(choice.get("finish_reason"))
        return info
    content = raw.get("content")
    if isinstance(content, list) and raw.get("role") == "assistant":  # Anthropic message
        texts, thoughts = [], []
        for block in content:
            part = convert_part(block)
            if part.get("type") == "text":
                texts.append(part.get("content", ""))
            elif part.get("type") == "reasoning":
                thoughts.append(part.get("content", ""))
            elif part.get("type") == "tool_call":
                info["tool_calls"].append(part)
        info["text"] = "".join(texts) if texts else None
        info["reasoning"] = "\n".join(thoughts) if thoughts else None
        info["finish_reason"] = map_finish_reason(raw.get("stop_reason"))
        return info
    candidates = raw.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], Mapping):  # Gemini
        cand = candidates[0]
        parts = (cand.get("content") or {}).get("parts") or []
        texts = []
        for p in parts:
            part = convert_part(p)
            if part.get("type") == "text":
                texts.append(part.get("content", ""))
            elif part.get("type") == "tool_call":
                info["tool_calls"].append(part)
        info["text"] = "".join(texts) if texts else None
        info["finish_reason"] = map_finish_reason(cand.get("finishReason"))
        return info
    output = raw.get("output")
    if isinstance(output, list):  # OpenAI Responses API
        texts = []
        for item in output:
            if not isinstance(item, Mapping):
                continue
            if item.get("type") == "message":
                for p in item.get("content") or ():
                    part = convert_part(p)
                    if part.get("type") == "text":
                        texts.append(part.get("content", ""))
            elif item.get("type") == "function_call":
                info["tool_calls"].append(convert_part(item))
        info["text"] = "".join(texts) if texts else None
        status = raw.get("status")
        info["finish_reason"] = "tool_call" if info["tool_calls"] else ("stop" if status == "completed" else status)
    return info


def output_messages(text: str, reasoning: str, tool_calls: list[dict[str, Any]],
                    finish_reason: str | None) -> list[dict[str, Any]]:
    """The assistant's output as GenAI output messages (one choice)."""
    parts: list[dict[str, Any]] = []
    if reasoning:
        parts.append({"type": "reasoning", "content": reasoning})
    if text:
        parts.append(_text(text))
    parts.extend(tool_calls)
    return [{"role": "assistant", "parts": parts,
             "finish_reason": finish_reason or ("tool_call" if tool_calls else "stop")}]
