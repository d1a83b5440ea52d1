"""Recorded content values read back as GenAI messages, and GenAI messages written in the OpenAI chat shape.

Content arrives as JSON strings, as structured (kvlist/array) attribute values, in the GenAI
parts shape (``role`` + ``parts``) or in the OpenAI chat shape (``role`` + ``content`` +
``tool_calls``), or as LangChain serialised them (``messages_langchain``), alone, in a list or in a graph's
``{"messages": [...]}`` state. ``to_messages`` accepts all of them and gives back ``Message`` values;
``messages_record`` holds the other direction's rules (provider SDK shapes as capture records them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .jsontext import dump_json, parse_any_json
from .messages_langchain import langchain_message


@dataclass(slots=True)
class Message:
    """One chat message in the GenAI message schema (``role`` plus typed ``parts``)."""

    role: str
    parts: list[dict[str, Any]] = field(default_factory=list)
    name: str | None = None
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(
            str(p.get("content") or "") for p in self.parts if p.get("type") == "text"
        )

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [p for p in self.parts if p.get("type") == "tool_call"]

    @property
    def tool_responses(self) -> list[dict[str, Any]]:
        return [p for p in self.parts if p.get("type") == "tool_call_response"]

    def content(self) -> str:
        """The message as one string: its text, or for a tool message its response."""
        if self.text or not self.tool_responses:
            return self.text
        return "".join(_as_text(p.get("response")) for p in self.tool_responses)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content()}
        calls = self.tool_calls
        if calls:
            out["tool_calls"] = [
                {"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
                for c in calls
            ]
        responses = self.tool_responses
        if responses and responses[0].get("id"):
            out["tool_call_id"] = responses[0].get("id")
        return out

    def to_openai(self) -> list[dict[str, Any]]:
        """OpenAI chat-format message(s); a tool message becomes one message per response."""
        if self.role == "tool" or (self.tool_responses and not self.text):
            return [
                {
                    "role": "tool",
                    "tool_call_id": p.get("id") or "",
                    "content": _as_text(p.get("response")),
                }
                for p in self.tool_responses
            ] or [{"role": "tool", "tool_call_id": "", "content": self.text}]
        msg: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.name:
            msg["name"] = self.name
        calls = self.tool_calls
        if calls:
            msg["content"] = self.text or None
            msg["tool_calls"] = [
                {
                    "id": c.get("id") or f"call_{i}",
                    "type": "function",
                    "function": {"name": c.get("name"), "arguments": _as_text(c.get("arguments"))},
                }
                for i, c in enumerate(calls)
            ]
        return [msg]


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return dump_json(value)



def to_messages(value: Any, default_role: str = "user") -> list[Message]:
    """Normalize a messages value (GenAI parts shape, OpenAI shape, JSON text, or plain text)."""
    value = parse_any_json(value)
    if value is None or value == "":
        return []
    if isinstance(value, dict):
        if "messages" in value and isinstance(value["messages"], list):
            return to_messages(value["messages"], default_role)
        lc = langchain_message(value)
        if lc is not None:
            return [_one_message(lc, default_role)]
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
            isinstance(i, dict) and "type" in i and "role" not in i and "parts" not in i
            and langchain_message(i) is None for i in items
        ):
            # an array of parts (system instructions) is one message
            return [Message(role=default_role, parts=[_part(i) for i in items])]
        out: list[Message] = []
        for item in items:
            if isinstance(item, dict):
                out.append(_one_message(langchain_message(item) or item, default_role))
            elif isinstance(item, list):  # a batch of conversations (LangChain's ``{"messages": [[...]]}``)
                out.extend(to_messages(item, default_role))
            elif isinstance(item, str):
                out.append(Message(role=default_role, parts=[{"type": "text", "content": item}]))
        return out
    return [Message(role=default_role, parts=[{"type": "text", "content": str(value)}])]


def system_messages(value: Any) -> list[Message]:
    """System instructions (``gen_ai.system_instructions``, any shape ``to_messages`` reads) as ``system``
    messages, whatever role a message names; none for None."""
    if value is None:
        return []
    out = to_messages(value, "system")
    for m in out:
        m.role = "system"
    return out


def _one_message(item: dict[str, Any], default_role: str) -> Message:
    role = str(item.get("role") or default_role)
    name = item.get("name")
    finish = item.get("finish_reason")
    if "parts" in item and isinstance(item["parts"], list):
        parts = [_part(p) for p in map(parse_any_json, item["parts"]) if isinstance(p, dict)]
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
    """Recorded tool definitions (JSON text, GenAI or OpenAI chat shape) in the GenAI shape ``{type, name,
    description, parameters}``; nameless ones are left out. Recording takes SDK tool objects with
    ``messages_record.tool_definitions`` instead, which keeps whatever it does not know."""
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
