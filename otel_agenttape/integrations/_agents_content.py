"""What the Agents SDK's spans hold, as capture takes it: chat messages, their text and tool calls,
Responses-API items converted with the SDK's own converter, and span errors as text."""

from __future__ import annotations

from typing import Any


def tool_calls(messages: Any) -> list[dict[str, Any]]:
    """Chat-format tool calls ({id, type, function: {name, arguments}}) in assistant messages."""
    out: list[dict[str, Any]] = []
    for m in messages or []:
        if isinstance(m, dict) and m.get("role") == "assistant":
            out += [tc for tc in m.get("tool_calls") or [] if isinstance(tc, dict)]
    return out


def text_of(messages: Any) -> str:
    parts: list[str] = []
    for m in messages or []:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [c.get("text", "") for c in content if isinstance(c, dict) and isinstance(c.get("text"), str)]
    return "".join(parts)


def split_system(messages: list[Any]) -> tuple[str | None, list[Any]]:
    system = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") in ("system", "developer")]
    rest = [m for m in messages if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))]
    text = "\n".join(s for s in system if isinstance(s, str))
    return (text or None), rest


def dump(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json", exclude_unset=True) if callable(dump) else obj


def chat_messages(items: Any) -> list[Any]:
    """Responses-API input/output items as chat messages, with the SDK's own converter."""
    from agents.models.chatcmpl_converter import Converter

    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return [dump(m) for m in Converter.items_to_messages([dump(i) for i in items])]


def error_text(error: Any) -> str | None:
    if not error:
        return None
    if isinstance(error, dict):
        message = error.get("message") or "error"
        data = error.get("data")
        return f"{message}: {data}" if data else str(message)
    return str(error)
