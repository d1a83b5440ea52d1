"""Nodes from spans of any convention: agenttape, OTel GenAI, OpenInference, OpenLLMetry.

Each span is classified (run, model, tool, other) by attributes, never by span name, and its
content is read from the first convention that has it: GenAI attributes (JSON text or structured),
the ``gen_ai.client.inference.operation.details`` log record, the older per-message log events,
OpenInference flattened ``llm.*_messages.N.message.*`` attributes and ``input.value``/``output.value``,
and OpenLLMetry's legacy indexed ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from .. import semconv as sc
from ..codec.jsontext import dump_json, parse_any_json
from ..codec.messages_flat import (
    choice_messages,
    event_messages,
    indexed_list,
    legacy_messages,
    oi_messages,
    response_messages,
)
from ..codec.messages_read import Message, system_messages, to_messages, tool_definitions
from . import frameworks
from .load import SpanRow
from .model import Node, Usage
from .roles import (  # noqa: F401 - the role names are read as foreign.RUN, foreign.classify, ...
    MODEL,
    OTHER,
    RUN,
    SESSION_KEYS,
    TOOL,
    _first,
    _is_indexed,
    classify,
    convention,
    session_of,
    source,
)

_LEGACY_EVENTS = {
    sc.EVENT_SYSTEM_MESSAGE: "system",
    sc.EVENT_USER_MESSAGE: "user",
    sc.EVENT_ASSISTANT_MESSAGE: "assistant",
    sc.EVENT_TOOL_MESSAGE: "tool",
}
OI_SESSION_ID = sc.OI_SESSION_ID
OI_AGENT_NAME = sc.OI_AGENT_NAME
OI_LLM_TOOLS = sc.OI_LLM_TOOLS + "."
LLM_REQUEST_TYPE = sc.LLM_REQUEST_TYPE
LLM_REQUEST_FUNCTIONS = sc.LLM_REQUEST_FUNCTIONS_PREFIX


def lacks_content(span: SpanRow) -> bool:
    """A model span with no prompt on its attributes: its content may be on log records."""
    if classify(span) != MODEL:
        return False
    a = span.attrs
    return not (
        sc.GEN_AI_INPUT_MESSAGES in a
        or sc.OI_INPUT_VALUE in a
        or _is_indexed(a, sc.OI_LLM_INPUT_MESSAGES + ".")
        or _is_indexed(a, sc.LEGACY_PROMPT_PREFIX)
    )


# --- log records --------------------------------------------------------------------------------


def _from_logs(span: SpanRow) -> tuple[dict[str, Any], list[Message], list[Message]]:
    """Content carried on log records correlated with the span."""
    details: dict[str, Any] = {}
    inputs: list[Message] = []
    outputs: list[Message] = []
    for log in span.logs:
        name = log.get("event_name")
        body = log.get("body")
        if name == sc.EVENT_INFERENCE_DETAILS:
            for k, v in log["attrs"].items():
                details.setdefault(k, v)
            if isinstance(body, dict):
                for k, v in body.items():
                    details.setdefault(k, v)
        elif name in _LEGACY_EVENTS:
            inputs.extend(event_messages(_LEGACY_EVENTS[name], body))
        elif name == sc.EVENT_CHOICE and isinstance(body, dict):
            outputs.extend(choice_messages(body))
    return details, inputs, outputs


# --- payload integrity --------------------------------------------------------------------------


def truncated_keys(span: SpanRow) -> list[str]:
    """Attributes recorded as cut, or whose recorded length/hash no longer matches."""
    a = span.attrs
    keys = [str(k) for k in (a.get(sc.TRUNCATED) or []) if k]
    for key, value in a.items():
        if key.endswith(sc.PAYLOAD_LENGTH_SUFFIX):
            base = key[: -len(sc.PAYLOAD_LENGTH_SUFFIX)]
            current = a.get(base)
            if base in keys:
                continue
            data = (current if isinstance(current, str) else dump_json(current)).encode("utf-8")
            if current is None or len(data) != int(value):
                keys.append(base)
                continue
            digest = a.get(base + sc.PAYLOAD_SHA256_SUFFIX)
            if digest and hashlib.sha256(data).hexdigest() != digest:
                keys.append(base)
    if span.dropped_events:
        keys.append("events")
    return keys


# --- extraction ---------------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def usage_of(a: dict[str, Any]) -> Usage:
    return Usage(
        input_tokens=_int(_first(a, sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_PROMPT_TOKENS, sc.OI_TOKEN_PROMPT)),
        output_tokens=_int(
            _first(a, sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.GEN_AI_USAGE_COMPLETION_TOKENS, sc.OI_TOKEN_COMPLETION)
        ),
        cache_read_input_tokens=_int(
            _first(a, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS_LEGACY,
                   sc.OI_TOKEN_CACHE_READ)
        ),
        cache_write_input_tokens=_int(
            _first(a, sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS, sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
                   sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS_LEGACY, sc.OI_TOKEN_CACHE_WRITE)
        ),
        reasoning_output_tokens=_int(
            _first(a, sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, sc.OI_TOKEN_REASONING)
        ),
    )


def _event_text(event: dict[str, Any]) -> str:
    a = event["attrs"]
    for key in (sc.EVENT_SEGMENT, "text", "content", "delta"):
        if isinstance(a.get(key), str):
            return a[key]
    return ""


def _ordered_events(span: SpanRow) -> list[dict[str, Any]]:
    def key(e: dict[str, Any]) -> tuple[int, int]:
        seq = _int(e["attrs"].get(sc.EVENT_SEQ))
        return (seq if seq is not None else e["index"], e["index"])

    return sorted(span.events, key=key)


_STATUS = {1: "ok", 2: "error"}


def _status(span: SpanRow) -> str:
    return _STATUS.get(span.status_code, "unset")


def _base(span: SpanRow, node_type: str, ordered: list[dict[str, Any]] | None = None) -> Node:
    """The fields every node has; ``ordered``: the span's events in order, when the caller has them."""
    a = span.attrs
    return Node(
        node_type=node_type,
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        name=span.name,
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        status=_status(span),
        status_message=span.status_message,
        convention=convention(span),
        run_id=span.run_id or a.get(sc.RUN_ID),
        node_id=a.get(sc.NODE_ID),
        turn_id=None if a.get(sc.TURN_ID) is None else str(a.get(sc.TURN_ID)),
        step=_int(a.get(sc.STEP)),
        truncated=truncated_keys(span),
        erased=list(span.erased),
        events=[{"name": e["name"], "time_ns": e["time_ns"], **e["attrs"]}
                for e in (_ordered_events(span) if ordered is None else ordered)],
        attributes=dict(a),
    )


def _messages_of(a: dict[str, Any], genai_key: str, role: str, oi_prefix: str, legacy_prefix: str,
                 from_logs: list[Message], value_key: str, parse_value: Any) -> list[Message] | None:
    """A model node's input or output messages from the first convention that holds them: GenAI attributes,
    OpenInference's indexed list, the legacy prompt/completion prefix, log events, OpenInference's value
    (read by ``parse_value``); None when none does."""
    if a.get(genai_key) is not None:
        return to_messages(a[genai_key], role)
    if _is_indexed(a, oi_prefix):
        return oi_messages(a, oi_prefix)
    if _is_indexed(a, legacy_prefix):
        return legacy_messages(a, legacy_prefix, role)
    if from_logs:
        return from_logs
    if a.get(value_key) is not None:
        return parse_value(a[value_key])
    return None


_LLM_PREFIX = os.path.commonprefix([OI_LLM_TOOLS, LLM_REQUEST_FUNCTIONS])  # "llm.", derived so it follows both


def _has_prefix(a: dict[str, Any], prefix: str) -> bool:
    return any(k.startswith(prefix) for k in a)


def model_node(span: SpanRow, *, prompt: bool = True) -> Node:
    """A model span as a node; ``prompt=False`` leaves its prompt (system, input messages, tool
    definitions) unread, for readers that compare answers only (``experiment compare``)."""
    ordered = _ordered_events(span)
    node = _base(span, MODEL, ordered)
    details, log_inputs, log_outputs = _from_logs(span)
    a = {**details, **span.attrs} if details else span.attrs  # (read only below)
    node.provider = _first(a, sc.GEN_AI_PROVIDER_NAME, sc.GEN_AI_SYSTEM, sc.OI_LLM_PROVIDER, sc.OI_LLM_SYSTEM)
    node.request_model = _first(a, sc.GEN_AI_REQUEST_MODEL, sc.OI_LLM_REQUEST_MODEL_NAME, sc.OI_LLM_MODEL_NAME)
    node.model = (
        _first(a, sc.GEN_AI_RESPONSE_MODEL, sc.OI_LLM_RESPONSE_MODEL_NAME, sc.OI_LLM_MODEL_NAME) or node.request_model
    )

    if prompt:
        node.system_instructions = system_messages(a.get(sc.GEN_AI_SYSTEM_INSTRUCTIONS))
        found = _messages_of(a, sc.GEN_AI_INPUT_MESSAGES, "user", sc.OI_LLM_INPUT_MESSAGES + ".",
                             sc.LEGACY_PROMPT_PREFIX, log_inputs, sc.OI_INPUT_VALUE, to_messages)
        if found is not None:
            node.input_messages = found
    found = _messages_of(a, sc.GEN_AI_OUTPUT_MESSAGES, "assistant", sc.OI_LLM_OUTPUT_MESSAGES + ".",
                         sc.LEGACY_COMPLETION_PREFIX, log_outputs, sc.OI_OUTPUT_VALUE, response_messages)
    if found is not None:
        node.output_messages = found

    texts, reasoning = [], []
    for e in ordered:
        if e["name"] == sc.EVENT_TEXT:
            texts.append(_event_text(e))
        elif e["name"] == sc.EVENT_REASONING:
            reasoning.append(_event_text(e))
        elif e["name"] == sc.EVENT_RETRY:
            node.retry_count += 1
    node.deltas = texts
    if texts:
        node.output_text = "".join(texts)
    elif isinstance(a.get(sc.MODEL_OUTPUT_TEXT), str):
        node.output_text = a[sc.MODEL_OUTPUT_TEXT]
    else:
        node.output_text = "".join(m.text for m in node.output_messages)
    if reasoning:
        node.reasoning = "\n".join(reasoning)
    elif isinstance(a.get(sc.MODEL_REASONING), str):
        node.reasoning = a[sc.MODEL_REASONING]
    else:
        node.reasoning = "\n".join(
            str(p.get("content") or "") for m in node.output_messages for p in m.parts if p.get("type") == "reasoning"
        )
    node.retry_count = _int(a.get(sc.MODEL_RETRY_COUNT)) or node.retry_count
    node.raw_output = parse_any_json(a.get(sc.MODEL_RAW_OUTPUT))
    if node.raw_output is None and a.get(sc.OPENINFERENCE_SPAN_KIND) and (
        a.get(sc.OI_OUTPUT_MIME_TYPE) == "application/json"
    ):
        node.raw_output = parse_any_json(a.get(sc.OI_OUTPUT_VALUE))  # the provider response body
    finish = a.get(sc.GEN_AI_RESPONSE_FINISH_REASONS) or a.get(sc.OI_LLM_FINISH_REASON)
    if isinstance(finish, str):
        finish = [finish]
    node.finish_reasons = [str(f) for f in finish or []] or [
        m.finish_reason for m in node.output_messages if m.finish_reason
    ]
    if prompt and a.get(sc.GEN_AI_TOOL_DEFINITIONS) is not None:
        node.tool_definitions = tool_definitions(a[sc.GEN_AI_TOOL_DEFINITIONS])
    elif prompt and _has_prefix(a, _LLM_PREFIX):  # one pass first: both indexed lists start with it
        if _is_indexed(a, OI_LLM_TOOLS):
            node.tool_definitions = tool_definitions(
                [parse_any_json((t.get("tool") or {}).get("json_schema")) for t in indexed_list(a, OI_LLM_TOOLS)
                 if isinstance(t, dict)]
            )
        elif _is_indexed(a, LLM_REQUEST_FUNCTIONS):
            node.tool_definitions = tool_definitions(indexed_list(a, LLM_REQUEST_FUNCTIONS))
    node.usage = usage_of(a)
    node.request = {
        k: a[k]
        for k in (sc.GEN_AI_REQUEST_TEMPERATURE, sc.GEN_AI_REQUEST_TOP_P, sc.GEN_AI_REQUEST_MAX_TOKENS,
                  sc.GEN_AI_REQUEST_STREAM)
        if k in a
    }
    return node


def tool_node(span: SpanRow) -> Node:
    node = _base(span, TOOL)
    a = span.attrs
    node.tool_name = _first(a, sc.GEN_AI_TOOL_NAME, sc.OI_TOOL_NAME, sc.TRACELOOP_ENTITY_NAME) or span.name
    node.tool_call_id = _first(a, sc.GEN_AI_TOOL_CALL_ID, sc.OI_TOOL_ID)
    node.arguments = _read_first(a, sc.GEN_AI_TOOL_CALL_ARGUMENTS, sc.OI_INPUT_VALUE, sc.TRACELOOP_ENTITY_INPUT,
                                 last=_traceloop_input)
    node.result = _read_first(a, sc.GEN_AI_TOOL_CALL_RESULT, sc.OI_OUTPUT_VALUE, sc.TRACELOOP_ENTITY_OUTPUT)
    err = a.get(sc.TOOL_ERROR)
    if err is None and span.status_code == 2:
        err = span.status_message or a.get(sc.ERROR_TYPE) or "error"
    node.tool_error = None if err is None else str(err)
    return node


def _read_first(a: dict[str, Any], *keys: str, last: Any = parse_any_json) -> Any:
    """The value of the first of ``keys`` present, parsed as JSON text (the last key's by ``last``); None when
    none is."""
    for key in keys:
        if key in a:
            return (last if key == keys[-1] else parse_any_json)(a[key])
    return None


def _traceloop_input(value: Any) -> Any:
    parsed = parse_any_json(value)
    if isinstance(parsed, dict) and set(parsed) <= {"args", "kwargs"}:
        args, kwargs = parsed.get("args") or [], parsed.get("kwargs") or {}
        if not args:
            return kwargs
        if not kwargs and len(args) == 1:
            return args[0]
    return parsed


def run_content(span: SpanRow) -> tuple[list[Message], list[Message], str | None]:
    """Input messages, output messages and agent name a run span itself carries (any convention); a message
    with nothing in it (no text, no tool call) is left out, so a run span that carries none says so."""
    a = span.attrs
    inputs = system_messages(a.get(sc.GEN_AI_SYSTEM_INSTRUCTIONS))
    if a.get(sc.GEN_AI_INPUT_MESSAGES) is not None:
        inputs += to_messages(a[sc.GEN_AI_INPUT_MESSAGES])
    elif a.get(sc.OI_INPUT_VALUE) is not None:
        inputs += to_messages(a[sc.OI_INPUT_VALUE])
    elif a.get(sc.TRACELOOP_ENTITY_INPUT) is not None:
        inputs += to_messages(_traceloop_input(a[sc.TRACELOOP_ENTITY_INPUT]))
    outputs: list[Message] = []
    if a.get(sc.GEN_AI_OUTPUT_MESSAGES) is not None:
        outputs = to_messages(a[sc.GEN_AI_OUTPUT_MESSAGES], "assistant")
    elif isinstance(a.get(sc.MODEL_OUTPUT_TEXT), str):
        outputs = [Message("assistant", [{"type": "text", "content": a[sc.MODEL_OUTPUT_TEXT]}])]
    elif a.get(sc.OI_OUTPUT_VALUE) is not None:
        outputs = response_messages(a[sc.OI_OUTPUT_VALUE])
    elif a.get(sc.TRACELOOP_ENTITY_OUTPUT) is not None:
        outputs = response_messages(a[sc.TRACELOOP_ENTITY_OUTPUT])
    inputs = [m for m in inputs if m.parts]
    outputs = [m for m in outputs if m.parts]
    agent = _first(a, sc.GEN_AI_AGENT_NAME, OI_AGENT_NAME) or span.agent_name
    if agent is None and str(a.get(sc.TRACELOOP_SPAN_KIND) or "").lower() in ("agent", "workflow"):
        agent = _first(a, sc.TRACELOOP_ENTITY_NAME, sc.TRACELOOP_WORKFLOW_NAME)
    return inputs, outputs, agent


def node_of(span: SpanRow) -> Node | None:
    kind = classify(span)
    if kind == MODEL:
        return model_node(span)
    if kind == TOOL:
        return frameworks.refine_tool(span, tool_node(span))
    return None
