"""Node replay: rebuild a model result from the recording, or re-send a recorded node live.

``replay_model_mock`` is deterministic (no model call): the raw provider payload first, the
recorded output text as fallback. ``replay_model_live`` feeds the recorded prompt to a real client,
for comparing models on the same node. ``replay_tool_live`` lets the caller decide how a recorded
tool call is re-bound. A node of the wrong type is a caller error (``ValueError``), never a skip.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import semconv as sc
from ..codec.jsontext import parse_any_json
from ..codec.messages_read import openai_tools, to_messages
from ..resume.errors import RecordedToolError
from .model import Node, ToolCall, Usage


class TruncatedPayloadError(ValueError):
    """The recorded payload was cut at capture time: replaying it would not be the real output."""


@dataclass
class ModelResult:
    """A model call's result as replay gives it back."""

    text: str
    raw: Any = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str = ""
    finish_reason: str | None = None
    model: str | None = None
    usage: Usage = field(default_factory=Usage)
    deltas: list[str] = field(default_factory=list)

    @property
    def output(self) -> Any:
        """The raw payload when recorded, else the text (the baseline's precedence)."""
        return self.raw if self.raw is not None else self.text


def _require(node: Node, kind: str) -> None:
    if not isinstance(node, Node) or node.node_type != kind:
        got = getattr(node, "node_type", type(node).__name__)
        raise ValueError(f"expected a {kind} node, got {got}")


_OUTPUT_KEYS = (sc.MODEL_RAW_OUTPUT, sc.MODEL_OUTPUT_TEXT, sc.GEN_AI_OUTPUT_MESSAGES, "events")


def check_whole(node: Node) -> None:
    """Refuse a node whose output payload was cut at capture time."""
    cut = [k for k in node.truncated if k in _OUTPUT_KEYS or k == sc.GEN_AI_TOOL_CALL_RESULT]
    if cut:
        raise TruncatedPayloadError(
            f"node {node.span_id} ({node.name}) has truncated payloads: {', '.join(cut)}"
        )


def replay_model_mock(node: Node) -> ModelResult:
    """The recorded model result, rebuilt without calling a model."""
    _require(node, "model")
    check_whole(node)
    text = node.output_text
    raw = node.raw_output
    if raw is None and not text and node.output_messages:
        text = "".join(m.text for m in node.output_messages)
    return ModelResult(
        text=text,
        raw=raw,
        tool_calls=[
            {"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
            for c in node.requested_tool_calls
        ],
        reasoning=node.reasoning,
        finish_reason=node.finish_reasons[0] if node.finish_reasons else None,
        model=node.model,
        usage=node.usage,
        deltas=list(node.deltas) if node.deltas else ([text] if text else []),
    )


def recorded_request(node: Node) -> dict[str, Any]:
    """The recorded prompt as an OpenAI-style chat request (model, messages, tools)."""
    _require(node, "model")
    messages = [m2 for m in node.prompt for m2 in m.to_openai()]
    request: dict[str, Any] = {"model": node.request_model or node.model, "messages": messages}
    if node.tool_definitions:
        request["tools"] = openai_tools(node.tool_definitions)
    return request


def replay_model_live(node: Node, client: Any) -> ModelResult:
    """Send the recorded prompt to a real client and return what it answers now.

    ``client`` is an OpenAI-style client (``client.chat.completions.create``), an object with
    ``create(**request)``, or a callable taking the request dict.
    """
    request = recorded_request(node)
    chat = getattr(getattr(client, "chat", None), "completions", None)
    if chat is not None and hasattr(chat, "create"):
        response = chat.create(**request)
    elif hasattr(client, "create"):
        response = client.create(**request)
    elif callable(client):
        response = client(request)
    else:
        raise TypeError("client must have chat.completions.create, create, or be callable")
    return result_from_response(response)


def result_from_response(response: Any) -> ModelResult:
    """Normalize a client's answer (ModelResult, OpenAI object or dict, or text)."""
    if isinstance(response, ModelResult):
        return response
    raw = response.model_dump() if hasattr(response, "model_dump") else response
    raw = parse_any_json(raw)
    if isinstance(raw, dict) and isinstance(raw.get("choices"), list) and raw["choices"]:
        choice = raw["choices"][0]
        msgs = to_messages([choice.get("message") or {}], "assistant")
        msg = msgs[0] if msgs else None
        usage = raw.get("usage") or {}
        return ModelResult(
            text=msg.text if msg else "",
            raw=raw,
            tool_calls=[{"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
                        for c in (msg.tool_calls if msg else [])],
            finish_reason=choice.get("finish_reason"),
            model=raw.get("model"),
            usage=Usage(input_tokens=usage.get("prompt_tokens"), output_tokens=usage.get("completion_tokens")),
        )
    return ModelResult(text=raw if isinstance(raw, str) else "", raw=None if isinstance(raw, str) else raw)


def replay_tool_live(node: Node, fn: Callable[[ToolCall], Any]) -> ToolCall:
    """Re-invoke a recorded tool call through ``fn`` (the caller re-binds the tool)."""
    _require(node, "tool")
    call = ToolCall(name=node.tool_name, arguments=node.arguments, call_id=node.tool_call_id, span_id=node.span_id)
    result = fn(call)
    return ToolCall(name=call.name, arguments=call.arguments, result=result, call_id=call.call_id,
                    span_id=node.span_id, executed=True)


def replay_tool_mock(node: Node) -> Any:
    """The recorded tool result; a recorded failure is raised again (see ``recorded_failure``)."""
    _require(node, "tool")
    check_whole(node)
    if node.tool_error:
        raise recorded_failure(node.tool_name, node.tool_error)
    return node.result


def recorded_failure(tool: str | None, error: str) -> Exception:
    """The exception a tool raised, rebuilt from its recorded ``"Type: message"`` text.

    A built-in exception type is raised as itself; any other type as a ``RecordedToolError``
    subclass of the same name. Either way ``type(exc).__name__`` and ``str(exc)`` match the
    recording, so agent code that reports failures to the model sends the recorded text again.
    """
    name, sep, message = error.partition(": ")
    if not sep or not name.isidentifier():
        name, message = "RecordedToolError", error
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        try:
            exc = builtin(message)
        except TypeError:
            exc = None
        if exc is not None and str(exc) == message:
            return exc
    cls = RecordedToolError if name == "RecordedToolError" else type(name, (RecordedToolError,), {})
    return cls(name, message, tool=tool)
