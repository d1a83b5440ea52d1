"""LangChain's serialised messages read as OpenAI chat-shaped message dicts.

LangChain instrumentations write a message in one of three forms: the constructor form of
``langchain_core.load.dumpd`` (``{"lc": 1, "type": "constructor", "id": [..., "HumanMessage"],
"kwargs": {"content": ...}}``, on OpenInference's model spans), the ``messages_to_dict`` form
(``{"type": "human", "data": {"content": ...}}``, on its chain spans, a graph's state) and the plain
``message.model_dump()`` dict (``{"type": "human", "content": ...}``). None of them names a ``role``, so
read as a chat message each was a ``user`` message with no text; ``langchain_message`` gives the role,
the text, the tool calls and the tool call id instead.
"""

from __future__ import annotations

from typing import Any

_TYPE_ROLES = {"human": "user", "ai": "assistant", "system": "system", "developer": "system", "tool": "tool",
               "function": "tool", "chat": ""}
_CLASS_TYPES = {"HumanMessage": "human", "AIMessage": "ai", "SystemMessage": "system", "ToolMessage": "tool",
                "FunctionMessage": "function", "ChatMessage": "chat"}


def _type_of_class(name: Any) -> str | None:
    name = str(name)
    return _CLASS_TYPES.get(name[: -len("Chunk")] if name.endswith("Chunk") else name)


def langchain_message(item: dict[str, Any]) -> dict[str, Any] | None:
    """The message in the OpenAI chat shape (``role``, ``content``, ``tool_calls``, ``tool_call_id``, ``name``)
    when ``item`` is a LangChain message in one of its serialised forms; None when it is not one."""
    if "role" in item:
        return None
    ids = item.get("id")
    if item.get("lc") == 1 and item.get("type") == "constructor" and isinstance(ids, list) and ids:
        kind, data = _type_of_class(ids[-1]), item.get("kwargs")
    elif isinstance(item.get("data"), dict) and item.get("type") in _TYPE_ROLES:
        kind, data = str(item["type"]), item["data"]
    elif item.get("type") in _TYPE_ROLES and "content" in item:
        kind, data = str(item["type"]), item
    else:
        return None
    if kind is None or not isinstance(data, dict):
        return None
    role = _TYPE_ROLES[kind] or str(data.get("role") or "user")
    out: dict[str, Any] = {"role": role, "content": data.get("content")}
    if data.get("name"):
        out["name"] = data["name"]
    calls = [c for c in data.get("tool_calls") or [] if isinstance(c, dict)]
    if calls:
        out["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "arguments": c.get("args", c.get("arguments"))}
            if "function" not in c else c
            for c in calls
        ]
    else:
        extra = data.get("additional_kwargs") if isinstance(data.get("additional_kwargs"), dict) else {}
        if extra.get("tool_calls"):  # the provider's own (OpenAI-shaped) calls
            out["tool_calls"] = extra["tool_calls"]
    if role == "tool" and data.get("tool_call_id") is not None:
        out["tool_call_id"] = data["tool_call_id"]
    return out


def generation_messages(value: dict[str, Any]) -> list[Any] | None:
    """The messages of a LangChain ``LLMResult`` (``{"generations": [[{"text", "message"}]]}``) as message
    values (the message where a generation has one, else its text); None when ``value`` is not one."""
    batches = value.get("generations")
    if not isinstance(batches, list):
        return None
    out: list[Any] = []
    for batch in batches:
        for gen in batch if isinstance(batch, list) else [batch]:
            if not isinstance(gen, dict):
                continue
            if isinstance(gen.get("message"), dict):
                out.append(gen["message"])
            elif isinstance(gen.get("text"), str) and gen["text"]:
                out.append({"role": "assistant", "content": gen["text"]})
    return out
