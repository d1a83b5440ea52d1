"""What the frameworks' own instrumentations put on tool spans, read as the tool call it records.

LangChain tools hand their instrumentations a ``ToolMessage`` as output and the call's keyword
arguments beside a display string as input: OpenInference writes the message as ``output.value``
(``{"type": "tool", "data": {...}}``), OpenLLMetry as ``traceloop.entity.output`` (the serialized
``{"lc": 1, ..., "kwargs": {...}}`` form) with ``traceloop.entity.input`` holding ``inputs`` and the
``tool_call_id``. Read plainly they give a message object as the result and the whole callback
payload as the arguments; here they give the tool's content, the exact arguments and the call id.
(OpenInference keeps only LangChain's display string of the input, so its arguments stay that.)
"""

from __future__ import annotations

from typing import Any

from .. import semconv as sc
from ..codec.jsontext import parse_any_json
from .load import SpanRow
from .model import Node


def _tool_message(value: Any) -> dict[str, Any] | None:
    """The fields of a LangChain ``ToolMessage`` in either serialized form, else None."""
    value = parse_any_json(value)
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("output"), dict):  # OpenLLMetry: {"output": <message>, "kwargs": {...}}
        value = value["output"]
    if value.get("type") == "tool" and isinstance(value.get("data"), dict):  # messages_to_dict form
        return value["data"]
    ids = value.get("id")
    if value.get("lc") == 1 and isinstance(ids, list) and ids and ids[-1] == "ToolMessage":
        kwargs = value.get("kwargs")
        return kwargs if isinstance(kwargs, dict) else None
    return None


def refine_tool(span: SpanRow, node: Node) -> Node:
    """A tool node with LangChain's ``ToolMessage`` and callback payloads read as the call."""
    a = span.attrs
    message = _tool_message(a.get(sc.OI_OUTPUT_VALUE, a.get(sc.TRACELOOP_ENTITY_OUTPUT)))
    if message is not None:
        content = message.get("content")
        node.result = parse_any_json(content) if isinstance(content, str) else content
        node.tool_call_id = node.tool_call_id or message.get("tool_call_id")
        if message.get("status") == "error" and node.tool_error is None:
            node.tool_error = str(content)
    entry = parse_any_json(a.get(sc.TRACELOOP_ENTITY_INPUT))
    if isinstance(entry, dict) and isinstance(entry.get("inputs"), dict):
        node.arguments = entry["inputs"]
        kwargs = entry.get("kwargs") if isinstance(entry.get("kwargs"), dict) else {}
        node.tool_call_id = node.tool_call_id or kwargs.get("tool_call_id")
    return node
