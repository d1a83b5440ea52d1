"""Content values as instrumentations write them, normalized to the GenAI message schema.

Content arrives as JSON strings, as structured (kvlist/array) attribute values, in the GenAI
parts shape (``role`` + ``parts``) or in the OpenAI chat shape (``role`` + ``content`` +
``tool_calls``). These helpers accept all of them and give back plain Python values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from ..codec.jsontext import parse_any_json

if TYPE_CHECKING:
    from .model import Message


def dump_json(value: Any) -> str:
    return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS).decode("utf-8")


def _default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        import base64

        return base64.b64encode(obj).decode("ascii")
    if hasattr(obj, "to_json"):
        return obj.to_json()
    return str(obj)


def to_messages(value: Any, default_role: str = "user") -> list[Message]:
    """Normalize a messages value (GenAI parts shape, OpenAI shape, JSON text, or plain text)."""
    from .model import Message

    value = parse_any_json(value)
    if value is None or value == "":
        return []
    if isinstance(value, dict):
        if "messages" in value and isinstance(value["messages"], list):
            return to_messages(value["messages"], default_role)
        if "role" in value or "parts" in value:
            return [_one_message(value, default_role)]
        if "type" in value:
            return [Message(role=default_role, parts=[_part(value)])]
        if "content" in value:
            return [_one_message(value, default_role)]
        return [Message(role=default_role, parts=[{"type": "text", "content": dump_json(value)}])]
    if isinstance(value, list):
        items = [parse_any_json(i) for i in value]
        if items and all(
            isinstance(i, dict) and "type" in i and "role" not in i and "parts" not in i for i in items
        ):
            # an array of parts (system instructions) is one message
            return [Message(role=default_role, parts=[_part(i) for i in items])]
        out: list[Message] = []
        for item in items:
            if isinstance(item, dict):
                out.append(_one_message(item, default_role))
            elif isinstance(item, str):
                out.append(Message(role=default_role, parts=[{"type": "text", "content": item}]))
        return out
    return [Message(role=default_role, parts=[{"type": "text", "content": str(value)}])]


def _one_message(item: dict[str, Any], default_role: str) -> Message:
    from .model import Message

    role = str(item.get("role") or default_role)
    name = item.get("name")
    finish = item.get("finish_reason")
    if "parts" in item and isinstance(item["parts"], list):
        parts = [_part(parse_any_json(p)) for p in item["parts"] if isinstance(parse_any_json(p), dict)]
        return Message(role=role, parts=parts, name=name, finish_reason=finish)
    # OpenAI chat shape
    parts: list[dict[str, Any]] = []
    content = item.get("content")
    if role == "tool" and item.get("tool_call_id") is not None:
        parts.append(
            {"type": "tool_call_response", "id": item.get("tool_call_id"), "response": parse_any_json(content)}
        )
        content = None
    if isinstance(content, list):
        for c in content:
            if isinstance(c, dict):
                if c.get("type") in ("text", "input_text", "output_text"):
                    parts.append({"type": "text", "content": c.get("text", c.get("content", ""))})
                else:
                    parts.append(_part(c))
            elif isinstance(c, str):
                parts.append({"type": "text", "content": c})
    elif content is not None and content != "":
        parts.append({"type": "text", "content": content if isinstance(content, str) else dump_json(content)})
    for call in item.get("tool_calls") or []:
        call = parse_any_json(call)
        if not isinstance(call, dict):
            continue
        fn = call.get("function") or {}
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": fn.get("name", call.get("name")),
                "arguments": parse_any_json(fn.get("arguments", call.get("arguments"))),
            }
        )
    return Message(role=role, parts=parts, name=name, finish_reason=finish)


def _part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    out = dict(part)
    if kind == "tool_call":
        out["arguments"] = parse_any_json(part.get("arguments"))
    elif kind == "tool_call_response":
        if "response" not in out and "result" in out:  # the v1.41.0 example spelling
            out["response"] = out.pop("result")
        out["response"] = parse_any_json(out.get("response"))
    elif kind == "text" and "content" not in out and "text" in out:
        out["content"] = out.pop("text")
    return out


def messages_text(messages: list[Message]) -> str:
    return "".join(m.text for m in messages)


def tool_definitions(value: Any) -> list[dict[str, Any]]:
    """Tool definitions in the GenAI shape ``{type, name, description, parameters}``."""
    value = parse_any_json(value)
    if isinstance(value, dict):
        value = [value]
    out: list[dict[str, Any]] = []
    for item in value or []:
        item = parse_any_json(item)
        if not isinstance(item, dict):
            continue
        fn = item.get("function") if isinstance(item.get("function"), dict) else None
        src = fn or item
        entry = {"type": item.get("type") or "function", "name": src.get("name")}
        if src.get("description"):
            entry["description"] = src["description"]
        params = parse_any_json(src.get("parameters"))
        if params is not None:
            entry["parameters"] = params
        if entry["name"]:
            out.append(entry)
    return out


def openai_tools(defs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool definitions in the OpenAI chat ``tools`` shape."""
    out = []
    for d in defs:
        fn: dict[str, Any] = {"name": d["name"]}
        if d.get("description"):
            fn["description"] = d["description"]
        fn["parameters"] = d.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out
