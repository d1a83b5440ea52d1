"""Runs and nodes -> GenAI spans: which span each one gets, with which attributes and events.

A run is an ``invoke_agent`` span, a model node a ``chat`` span (CLIENT), a tool node an
``execute_tool`` span; the node spans share their identity attributes (``node_attributes``). Content
attributes go through ``PayloadContent``: redacted first, then cut with length + sha256 when too long.
The attributes a span starts with are in one dict (one validation pass); what completion adds is set
in one call before the span ends. ``tracer`` None maps nothing (every start returns None).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from otel_agenttape import semconv as sc
from otel_agenttape.capture.events import AgentEvent
from otel_agenttape.capture.fastspan import BareStart, set_valid_attributes
from otel_agenttape.codec.messages_record import (
    as_messages,
    convert_messages,
    output_messages,
    system_instructions,
    tool_definitions,
)
from otel_agenttape.capture.nodes import ModelNode, ModelRequest, RunState, ToolNode
from otel_agenttape.capture.records import MODEL, TOOL, NodeRecord
from otel_agenttape.capture.redact import Redactor
from otel_agenttape.capture.stats import CaptureStats
from otel_agenttape.capture.usage import ABSENT
from otel_agenttape.codec.jsontext import dumps, payload_text, to_plain

REQUEST_PARAM_ATTRIBUTES = {
    "max_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "max_output_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "max_completion_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "temperature": sc.GEN_AI_REQUEST_TEMPERATURE,
    "top_p": sc.GEN_AI_REQUEST_TOP_P,
    "stream": sc.GEN_AI_REQUEST_STREAM,
}


class PayloadContent:
    """Content attribute values: redacted, then cut to ``max_payload_chars`` (with the full length
    and sha256 beside the cut value, and the key listed as truncated)."""

    __slots__ = ("redactor", "max_payload_chars", "stats")

    def __init__(self, redactor: Redactor | None, max_payload_chars: int | None, stats: CaptureStats) -> None:
        self.redactor = redactor
        self.max_payload_chars = max_payload_chars
        self.stats = stats

    def put(self, key: str, value: Any, truncated: list[str], into: dict[str, Any]) -> None:
        """Add ``key`` to ``into`` (nothing for None)."""
        if value is None:
            return
        text = value if type(value) is str else payload_text(value)
        if self.redactor is not None:
            text = self.redactor(text)
        limit = self.max_payload_chars
        if limit is not None and len(text) > limit:
            data = text.encode("utf-8")
            into[key + sc.PAYLOAD_LENGTH_SUFFIX] = len(data)
            into[key + sc.PAYLOAD_SHA256_SUFFIX] = hashlib.sha256(data).hexdigest()
            text = text[:limit]
            truncated.append(key)
            self.stats.incr("payloads_truncated")
        into[key] = text

    def segment(self, text: str) -> str:
        """A streamed segment (span event): redacted, never cut."""
        return self.redactor(text) if self.redactor is not None and text else text


def node_attributes(e: AgentEvent, run: RunState | None, record: NodeRecord) -> dict[str, Any]:
    """The identity every node span carries (after its operation's own attributes)."""
    return {
        sc.GEN_AI_AGENT_NAME: run.agent if run else e.agent,
        sc.RUN_ID: e.run_id,
        sc.SESSION_ID: record.session_id,
        sc.PARENT_RUN_ID: run.parent_run_id if run else None,
        sc.TURN_ID: e.turn_id,
        sc.STEP: e.step,
        sc.NODE_TYPE: record.node_type,
        sc.NODE_ID: record.node_id,
        sc.RECORD_ID: record.record_id,
    }


class SpanMapper:
    """Starts, annotates and ends the spans of runs and nodes on ``tracer``."""

    __slots__ = ("tracer", "content", "bare_start")

    def __init__(self, tracer: trace.Tracer | None, content: PayloadContent) -> None:
        self.tracer = tracer
        self.content = content
        self.bare_start = BareStart(tracer)

    def start(self, name: str, kind: SpanKind, attrs: dict[str, Any], time_ns: int, context: Context | None,
              links: Sequence[Link] = (), *, bare: bool = False) -> Any:
        """Start a span. ``bare``: the attributes are all capture's own and the span is a node under a
        live run span (whose start already told the sealing processor the run), so they may be set right
        after the start when nothing reads them at start (fastspan.BareStart)."""
        if self.tracer is None:
            return None
        if bare and not links and self.bare_start.ok():
            span = self.tracer.start_span(name, context=context, kind=kind, start_time=time_ns)
            set_valid_attributes(span, attrs)
            return span
        return self.tracer.start_span(name, context=context, kind=kind, attributes=attrs,
                                      links=list(links) or None, start_time=time_ns)

    # ---- runs ------------------------------------------------------------------------------
    def start_run(self, e: AgentEvent, context: Context | None, links: Sequence[Link]) -> Any:
        if self.tracer is None:
            return None
        agent = e.agent
        attrs: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
            sc.GEN_AI_AGENT_NAME: agent,
            sc.RUN_ID: e.run_id,
            sc.SESSION_ID: e.session_id,
            sc.GEN_AI_CONVERSATION_ID: e.session_id,
            sc.PARENT_RUN_ID: e.parent_run_id,
            sc.TURN_ID: e.turn_id,
            sc.NODE_TYPE: "run",
            sc.NODE_ID: f"run@{e.run_id}",
            sc.GEN_AI_REQUEST_MODEL: e.model,
        }
        if e.attributes:
            attrs.update(e.attributes)
        attrs = without_none(attrs)
        if e.payload is not None:
            self.content.put(sc.GEN_AI_INPUT_MESSAGES, dumps(as_messages(e.payload, "user")), [], attrs)
        name = f"{sc.OP_INVOKE_AGENT} {agent}" if agent else sc.OP_INVOKE_AGENT
        return self.start(name, SpanKind.INTERNAL, attrs, e.time_ns, context, links)

    def end_run(self, span: Any, e: AgentEvent, status: str) -> None:
        if e.attributes:
            span.set_attributes(dict(e.attributes))
        done: dict[str, Any] = {}
        if e.payload is not None:
            self.content.put(sc.GEN_AI_OUTPUT_MESSAGES, dumps(as_messages(e.payload, "assistant")), [], done)
        done[sc.RUN_STATUS] = str(status)
        if status == sc.STATUS_ERROR:
            span.set_status(Status(StatusCode.ERROR, e.error or None))
            done[sc.ERROR_TYPE] = error_type(e.error)
        set_valid_attributes(span, done)
        span.end(end_time=e.time_ns)

    # ---- node spans ------------------------------------------------------------------------
    def _start_node(self, name: str, kind: SpanKind, attrs: dict[str, Any], e: AgentEvent,
                    run: RunState | None, context: Context | None) -> Any:
        if context is None and run is not None and run.span is not None:
            context = trace.set_span_in_context(run.span)
        bare = not e.attributes and run is not None and run.span is not None
        return self.start(name, kind, attrs, e.time_ns, context, bare=bare)

    def _node_start_attributes(self, own: dict[str, Any], e: AgentEvent, run: RunState | None,
                               record: NodeRecord, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The operation's own attributes, the node identity, request parameters, the caller's extra
        attributes (which may override any of them), in that order; None values left out."""
        attrs = {**own, **node_attributes(e, run, record)}
        if params:
            attrs.update(params)
        if e.attributes:
            attrs.update(e.attributes)
        return without_none(attrs)

    def start_model(self, node: ModelNode, request: ModelRequest, e: AgentEvent, run: RunState | None,
                    context: Context | None) -> Any:
        if self.tracer is None:
            return None
        model = request.model
        own: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_PROVIDER_NAME: node.provider,
            sc.GEN_AI_REQUEST_MODEL: model,
        }
        params = {REQUEST_PARAM_ATTRIBUTES[k]: v for k, v in request.params.items()
                  if isinstance(v, (bool, int, float, str))}
        attrs = self._node_start_attributes(own, e, run, node.record, params)
        # Content goes in with the start attributes: one validation pass, no extra span lock.
        put, truncated = self.content.put, node.truncated
        if request.messages is not None:
            put(sc.GEN_AI_INPUT_MESSAGES, dumps(convert_messages(request.messages)), truncated, attrs)
        if request.system:
            put(sc.GEN_AI_SYSTEM_INSTRUCTIONS, dumps(system_instructions(request.system)), truncated, attrs)
        if request.tools:
            put(sc.GEN_AI_TOOL_DEFINITIONS, dumps(tool_definitions(request.tools)), truncated, attrs)
        name = f"{sc.OP_CHAT} {model}" if model else sc.OP_CHAT
        return self._start_node(name, SpanKind.CLIENT, attrs, e, run, context)

    def start_tool(self, node: ToolNode, e: AgentEvent, run: RunState | None, context: Context | None) -> Any:
        if self.tracer is None:
            return None
        own: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: e.tool_name,
            sc.GEN_AI_TOOL_CALL_ID: e.call_id,
            sc.GEN_AI_TOOL_TYPE: "function",
        }
        attrs = self._node_start_attributes(own, e, run, node.record)
        arguments = node.record.inputs
        if arguments is not None:
            self.content.put(sc.GEN_AI_TOOL_CALL_ARGUMENTS, payload_text(to_plain(arguments)), node.truncated, attrs)
        name = f"{sc.OP_EXECUTE_TOOL} {e.tool_name}" if e.tool_name else sc.OP_EXECUTE_TOOL
        return self._start_node(name, SpanKind.INTERNAL, attrs, e, run, context)

    # ---- span events -----------------------------------------------------------------------
    def segment_event(self, span: Any, name: str, seq: int, text: str, time_ns: int) -> None:
        """A streamed text (``EVENT_TEXT``) or reasoning (``EVENT_REASONING``) segment."""
        if span is not None:
            span.add_event(name, {sc.EVENT_SEQ: seq, sc.EVENT_SEGMENT: self.content.segment(text)}, timestamp=time_ns)

    @staticmethod
    def retry_event(span: Any, seq: int, count: int, reason: str | None, time_ns: int) -> None:
        if span is not None:
            attrs: dict[str, Any] = {sc.EVENT_SEQ: seq, sc.MODEL_RETRY_COUNT: count}
            if reason:
                attrs[sc.EVENT_REASON] = reason
            span.add_event(sc.EVENT_RETRY, attrs, timestamp=time_ns)

    @staticmethod
    def metadata_event(span: Any, seq: int, data: Mapping[str, Any], time_ns: int) -> None:
        if span is not None:
            attrs: dict[str, Any] = {sc.EVENT_SEQ: seq}
            for k, v in data.items():
                attrs[str(k)] = v if isinstance(v, (str, bool, int, float)) else dumps(v)
            span.add_event(sc.EVENT_METADATA, attrs, timestamp=time_ns)

    @staticmethod
    def add_attributes(span: Any, attributes: Mapping[str, Any] | None) -> None:
        """A caller's extra attributes (``AgentEvent.attributes``) on a span that is still open."""
        if attributes and span is not None:
            span.set_attributes(dict(attributes))

    # ---- node completion -------------------------------------------------------------------
    def end_model(self, node: ModelNode, error: str | None, time_ns: int) -> None:
        span, rec, put, truncated = node.span, node.record, self.content.put, node.truncated
        done: dict[str, Any] = {sc.GEN_AI_RESPONSE_MODEL: as_text(node.response_model or rec.model_id or "")}
        if node.response_id:
            done[sc.GEN_AI_RESPONSE_ID] = as_text(node.response_id)
        finish = node.finish_reason or ("error" if error else None)
        if node.responses or error is None:
            out = output_messages(rec.output_text, rec.reasoning_text, node.tool_calls, finish)
            put(sc.GEN_AI_OUTPUT_MESSAGES, dumps(out), truncated, done)
            done[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (as_text(out[0]["finish_reason"]),)
        if rec.outputs is not None:
            put(sc.MODEL_RAW_OUTPUT, payload_text(rec.outputs), truncated, done)
        if rec.output_text:
            put(sc.MODEL_OUTPUT_TEXT, rec.output_text, truncated, done)
        if rec.reasoning_text:
            put(sc.MODEL_REASONING, rec.reasoning_text, truncated, done)
        done[sc.MODEL_RETRY_COUNT] = rec.retry_count
        u = node.usage
        for attr, value in ((sc.GEN_AI_USAGE_INPUT_TOKENS, u.input_tokens),
                            (sc.GEN_AI_USAGE_OUTPUT_TOKENS, u.output_tokens),
                            (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, u.cache_read_input_tokens),
                            (sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS, u.cache_write_input_tokens),
                            (sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, u.reasoning_output_tokens)):
            if value != ABSENT:
                done[attr] = value
        self._end(span, done, truncated, error, time_ns)

    def end_tool(self, node: ToolNode, e: AgentEvent, result: Any, error: str | None) -> None:
        span, rec = node.span, node.record
        attrs = getattr(span, "attributes", None) or {}
        done: dict[str, Any] = {}
        if rec.tool_name and e.tool_name and not attrs.get(sc.GEN_AI_TOOL_NAME):
            done[sc.GEN_AI_TOOL_NAME] = as_text(rec.tool_name)
            span.update_name(f"{sc.OP_EXECUTE_TOOL} {rec.tool_name}")
        if rec.call_id and not attrs.get(sc.GEN_AI_TOOL_CALL_ID):
            done[sc.GEN_AI_TOOL_CALL_ID] = as_text(rec.call_id)
        if error:
            self.content.put(sc.TOOL_ERROR, error, node.truncated, done)
            _set_error(span, done, error)  # a tool's error type comes before the cut keys
        elif result is not None:
            self.content.put(sc.GEN_AI_TOOL_CALL_RESULT, payload_text(rec.outputs), node.truncated, done)
        self._end(span, done, node.truncated, None, e.time_ns)

    @staticmethod
    def _end(span: Any, done: dict[str, Any], truncated: list[str], error: str | None, time_ns: int) -> None:
        """What every node span ends with: the cut keys, the error status and type, then the end."""
        if truncated:
            done[sc.TRUNCATED] = tuple(truncated)
        if error:
            _set_error(span, done, error)
        if done:
            set_valid_attributes(span, done)
        span.end(end_time=time_ns)


def _set_error(span: Any, done: dict[str, Any], error: str) -> None:
    span.set_status(Status(StatusCode.ERROR, error))
    done[sc.ERROR_TYPE] = error_type(error)


def without_none(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if v is not None}


def as_text(value: Any) -> str:
    return value if type(value) is str else str(value)


def error_type(error: str | None) -> str:
    if not error:
        return "_OTHER"
    head = error.split(":", 1)[0].strip()
    return head if head and " " not in head and len(head) <= 64 else "_OTHER"
