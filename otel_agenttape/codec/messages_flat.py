"""GenAI messages read from the flattened and legacy conventions: OpenInference ``llm.*_messages.N.message.*``
attributes, OpenLLMetry's legacy ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``, the older per-message log
events' bodies, and provider response bodies."""

from __future__ import annotations

from typing import Any

from .jsontext import parse_any_json
from .messages_langchain import generation_messages
from .messages_read import Message, to_messages


def unflatten(attrs: dict[str, Any], prefix: str) -> Any:
    """``prefix.0.message.role=...`` -> ``[{"message": {"role": ...}}]`` (digit segments = list)."""
    root: dict[str, Any] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix) :].split(".")
        node: Any = root
        ok = True
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            elif not isinstance(nxt, dict):
                ok = False
                break
            node = nxt
        if ok and not isinstance(node.get(parts[-1]), dict):
            node[parts[-1]] = value
    return _listify(root)


def _listify(value: Any) -> Any:
    if isinstance(value, dict):
        value = {k: _listify(v) for k, v in value.items()}
        if value and all(k.isdigit() for k in value):
            return [value[k] for k in sorted(value, key=int)]
    return value


def indexed_list(attrs: dict[str, Any], prefix: str) -> list[Any]:
    """Only the numbered entries under a prefix (``gen_ai.prompt.name`` is not a message)."""
    tree = unflatten(attrs, prefix)
    if isinstance(tree, list):
        return tree
    if isinstance(tree, dict):
        return [tree[k] for k in sorted((k for k in tree if k.isdigit()), key=int)]
    return []


def oi_messages(attrs: dict[str, Any], prefix: str) -> list[Message]:
    """OpenInference's ``llm.input_messages.N.message.*`` / ``llm.output_messages.N.message.*``."""
    raw = []
    for entry in indexed_list(attrs, prefix):
        msg = entry.get("message") if isinstance(entry, dict) else None
        if not isinstance(msg, dict):
            continue
        item: dict[str, Any] = {"role": msg.get("role") or "user"}
        if msg.get("name"):
            item["name"] = msg["name"]
        contents = msg.get("contents")
        if isinstance(contents, list) and msg.get("content") is None:
            parts = []
            for c in contents:
                mc = c.get("message_content") if isinstance(c, dict) else None
                if not isinstance(mc, dict):
                    continue
                kind = mc.get("type")
                if kind == "text":
                    parts.append({"type": "text", "text": mc.get("text", "")})
                elif kind == "reasoning":
                    parts.append({"type": "reasoning", "content": mc.get("text", "")})
                elif kind == "image":
                    url = (mc.get("image") or {}).get("image", {}).get("url")
                    parts.append({"type": "uri", "modality": "image", "uri": url})
                else:
                    parts.append({"type": kind or "generic", **{k: v for k, v in mc.items() if k != "type"}})
            item["content"] = parts
        else:
            item["content"] = msg.get("content")
        calls = []
        for tc in msg.get("tool_calls") or []:
            call = tc.get("tool_call") if isinstance(tc, dict) else None
            if isinstance(call, dict):
                fn = call.get("function") or {}
                calls.append(
                    {"id": call.get("id"), "function": {"name": fn.get("name"), "arguments": fn.get("arguments")}}
                )
        if calls:
            item["tool_calls"] = calls
        if msg.get("tool_call_id"):
            item["tool_call_id"] = msg["tool_call_id"]
        raw.append(item)
    return to_messages(raw)


def legacy_messages(attrs: dict[str, Any], prefix: str, role: str) -> list[Message]:
    """OpenLLMetry's ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``; ``role`` where an entry names none."""
    raw = []
    for entry in indexed_list(attrs, prefix):
        if not isinstance(entry, dict):
            continue
        item: dict[str, Any] = {
            "role": entry.get("role") or role,
            "content": entry.get("content"),
        }
        if entry.get("tool_call_id"):
            item["tool_call_id"] = entry["tool_call_id"]
        calls = [c for c in entry.get("tool_calls") or [] if isinstance(c, dict)]
        if calls:
            item["tool_calls"] = calls
        if entry.get("finish_reason"):
            item["finish_reason"] = entry["finish_reason"]
        raw.append(item)
    return to_messages(raw)


def event_messages(role: str, body: Any) -> list[Message]:
    """The body of an older per-message log event (``gen_ai.user.message`` and its kin) as a ``role`` message."""
    item: dict[str, Any] = {"role": role}
    if isinstance(body, dict):
        item["content"] = body.get("content")
        if body.get("tool_calls"):
            item["tool_calls"] = body["tool_calls"]
        if role == "tool":
            item["tool_call_id"] = body.get("id") or ""
    elif body is not None:
        item["content"] = body
    return to_messages([item])


def choice_messages(body: dict[str, Any]) -> list[Message]:
    """The body of an older ``gen_ai.choice`` log event: its message (the assistant's unless it names a role)
    with the choice's finish reason."""
    msg = dict(body.get("message") or {})
    msg.setdefault("role", "assistant")
    out = to_messages([msg], "assistant")
    for m in out:
        m.finish_reason = body.get("finish_reason")
    return out


def answer_messages(messages: list[Message]) -> list[Message]:
    """The answer of a conversation: the messages after its last user, system or tool message (a graph's
    output state holds the whole conversation, the question first); all of them when every one is the
    assistant's."""
    last = max((i for i, m in enumerate(messages) if m.role != "assistant"), default=-1)
    return messages[last + 1:]


def response_messages(value: Any) -> list[Message]:
    """Output messages from a provider response body (OpenAI chat shape, LangChain's ``LLMResult``, a
    conversation or a graph's ``{"messages": [...]}`` state, whose answer they are, or plain text)."""
    value = parse_any_json(value)
    if isinstance(value, dict):
        generations = generation_messages(value)
        if generations is not None:
            return to_messages(generations, "assistant")
    if isinstance(value, dict) and isinstance(value.get("choices"), list):
        out = []
        for choice in value["choices"]:
            if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
                msgs = to_messages([choice["message"]], "assistant")
                for m in msgs:
                    m.finish_reason = choice.get("finish_reason")
                out.extend(msgs)
        return out
    if isinstance(value, (dict, list)):
        return answer_messages(to_messages(value, "assistant"))
    if value is None or value == "":
        return []
    return [Message(role="assistant", parts=[{"type": "text", "content": str(value)}])]
