"""Events -> node records and GenAI spans: pairing, stream accumulation, usage, span mapping.

Baseline rules kept here: model nodes pair MODEL_REQUEST/MODEL_RESPONSE on ``run|turn|step`` and
complete at STEP_END; tool nodes pair TOOL_CALL/TOOL_RESULT on ``run|turn|step|callId`` (falling back to
the tool name, then ``anon``) and complete at TOOL_RESULT; streamed text is concatenated while the raw
payload keeps only the latest non-empty one; reasoning segments are joined by newlines; retries are
counted per step; a TOOL_RESULT without a TOOL_CALL is still captured, without input.
"""

from __future__ import annotations

import dataclasses

import hashlib
import threading
import random
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from otel_agenttape import semconv as sc
from otel_agenttape.capture.events import AgentEvent, EventType
from otel_agenttape.capture.fastspan import BareStart, set_valid_attributes
from otel_agenttape.capture.jsonutil import dumps, payload_text, to_plain
from otel_agenttape.capture.messages import (
    convert_messages,
    describe_response,
    map_finish_reason,
    output_messages,
    system_instructions,
    tool_definitions,
)
from otel_agenttape.capture.records import MODEL, TOOL, NodeRecord
from otel_agenttape.capture.redact import Redactor
from otel_agenttape.capture.sinks import NodeSink
from otel_agenttape.capture.stats import CaptureStats
from otel_agenttape.capture.usage import ABSENT, Usage, parse_usage

_REQUEST_PARAMS = {
    "max_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "max_output_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "max_completion_tokens": sc.GEN_AI_REQUEST_MAX_TOKENS,
    "temperature": sc.GEN_AI_REQUEST_TEMPERATURE,
    "top_p": sc.GEN_AI_REQUEST_TOP_P,
    "stream": sc.GEN_AI_REQUEST_STREAM,
}


def _new_id() -> str:
    # Unique record ids without a syscall per node (uuid4 reads os.urandom each time).
    return f"{random.getrandbits(128):032x}"


def _ms(time_ns: int) -> int:
    return time_ns // 1_000_000


def _hex_ids(span: Any) -> tuple[str | None, str | None]:
    ctx = span.get_span_context() if span is not None else None
    if ctx is None or not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


@dataclass(slots=True)
class _RunState:
    run_id: str
    span: Any
    agent: str | None
    session_id: str | None
    status: str | None = None
    error: str | None = None
    parent_run_id: str | None = None  # also on the run's node spans: a child that dies before its run
    # span ends (another process) still names its parent run


@dataclass(slots=True)
class _ModelNode:
    record: NodeRecord
    span: Any
    provider: str | None = None
    seq: int = 0
    texts: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    response_model: str | None = None
    response_id: str | None = None
    responses: int = 0
    truncated: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _ToolNode:
    record: NodeRecord
    span: Any
    key: str
    truncated: list[str] = field(default_factory=list)


class CaptureListener:
    """Consumes AgentEvents from any runtime. Never raises: failures are counted in ``stats``.

    ``tracer`` None records node records only (no spans).
    """

    def __init__(
        self,
        tracer: trace.Tracer | None = None,
        *,
        stats: CaptureStats | None = None,
        redactor: Redactor | None = None,
        sinks: Sequence[NodeSink] = (),
        max_payload_chars: int | None = None,
    ) -> None:
        self.tracer = tracer
        self.stats = stats or CaptureStats()
        self.redactor = redactor
        self.sinks: list[NodeSink] = list(sinks)
        self.max_payload_chars = max_payload_chars
        self._bare = BareStart(tracer)
        self._lock = threading.RLock()
        self._runs: dict[str, _RunState] = {}
        self._models: dict[str, _ModelNode] = {}
        self._tools: dict[str, deque[_ToolNode]] = {}
        self._retries: dict[str, int] = {}

    # ---- public entry points --------------------------------------------------------------
    def on_event(self, event: AgentEvent) -> None:
        """Feed one event. Safe to call from any thread; never raises into the runtime."""
        self.dispatch(event)

    __call__ = on_event

    def dispatch(self, event: AgentEvent, *, context: Context | None = None,
                 links: Sequence[Link] = (), pair: str | None = None) -> Any:
        """Handle an event; returns the span it started (RUN_START, MODEL_REQUEST, TOOL_CALL) or None.

        ``context`` parents the new span (default: the run span); ``pair`` is an explicit tool pairing
        token for callers that know which call a result belongs to.
        """
        try:
            with self._lock:
                return self._handle(event, context, links, pair)
        except Exception:
            self.stats.incr("listener_errors")
            return None

    def add_sink(self, sink: NodeSink) -> None:
        self.sinks.append(sink)

    def pending(self) -> dict[str, int]:
        """Open runs and nodes (for diagnostics)."""
        with self._lock:
            return {"runs": len(self._runs), "model_nodes": len(self._models),
                    "tool_nodes": sum(len(q) for q in self._tools.values())}

    # ---- keys ------------------------------------------------------------------------------
    @staticmethod
    def _step_key(e: AgentEvent) -> str:
        return f"{e.run_id}|{e.turn_id if e.turn_id is not None else ''}|{e.step if e.step is not None else ''}"

    # ---- dispatch --------------------------------------------------------------------------
    def _handle(self, e: AgentEvent, context: Context | None, links: Sequence[Link], pair: str | None) -> Any:
        t = e.type if type(e.type) is EventType else EventType(str(e.type))
        return _HANDLERS[t](self, e, context, links, pair)

    # ---- span helpers ----------------------------------------------------------------------
    def _parent(self, run_id: str, context: Context | None) -> Context | None:
        if context is not None:
            return context
        run = self._runs.get(run_id)
        if run is not None and run.span is not None:
            return trace.set_span_in_context(run.span)
        return None

    def _start_span(self, name: str, kind: SpanKind, attrs: dict[str, Any], time_ns: int,
                    context: Context | None, links: Sequence[Link] = (), *, bare: bool = False) -> Any:
        """Start a span. ``bare``: the attributes are all capture's own and the span is a node under a
        live run span (whose start already told the sealing processor the run), so they may be set right
        after the start when nothing reads them at start (fastspan.BareStart)."""
        if self.tracer is None:
            return None
        if bare and not links and self._bare.ok():
            span = self.tracer.start_span(name, context=context, kind=kind, start_time=time_ns)
            set_valid_attributes(span, attrs)
            return span
        return self.tracer.start_span(name, context=context, kind=kind, attributes=attrs,
                                      links=list(links) or None, start_time=time_ns)

    def _content(self, key: str, value: Any, truncated: list[str], into: dict[str, Any]) -> None:
        """Add a content attribute to ``into``: redacted first, then cut with length + sha256 when
        too long."""
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

    def _segment(self, text: str) -> str:
        return self.redactor(text) if self.redactor is not None and text else text

    def _redact_deep(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redactor(value) if value else value  # type: ignore[misc]
        if isinstance(value, dict):
            return {k: self._redact_deep(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._redact_deep(v) for v in value]
        return value

    def _redacted_record(self, record: NodeRecord) -> NodeRecord:
        """Local sinks get the same redaction as exported spans: secrets never reach disk either."""
        return dataclasses.replace(
            record,
            inputs=self._redact_deep(record.inputs),
            outputs=self._redact_deep(record.outputs),
            output_text=self._redact_deep(record.output_text),
            reasoning_text=self._redact_deep(record.reasoning_text),
            error=self._redact_deep(record.error),
        )

    def _emit_record(self, record: NodeRecord) -> None:
        stats = self.stats
        stats.incr("nodes_captured")
        stats.incr("model_nodes" if record.node_type == MODEL else "tool_nodes")
        if self.sinks and self.redactor is not None:
            try:
                record = self._redacted_record(record)
            except Exception:
                self.stats.incr("redactor_errors")
                return  # never write an unredacted record when redaction was asked for
        for sink in self.sinks:
            try:
                sink.write(record)
            except Exception:
                self.stats.incr("sink_errors")

    # ---- runs ------------------------------------------------------------------------------
    def _run_start(self, e: AgentEvent, context: Context | None, links: Sequence[Link]) -> Any:
        existing = self._runs.get(e.run_id)
        if existing is not None:
            return existing.span
        self.stats.incr("runs_started")
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
        attrs = _without_none(attrs)
        name = f"{sc.OP_INVOKE_AGENT} {agent}" if agent else sc.OP_INVOKE_AGENT
        parent = context
        if parent is None and e.parent_run_id and e.parent_run_id in self._runs:
            parent = trace.set_span_in_context(self._runs[e.parent_run_id].span)
        if self.tracer is not None and e.payload is not None:
            self._content(sc.GEN_AI_INPUT_MESSAGES, dumps(_as_messages(e.payload, "user")), [], attrs)
        span = self._start_span(name, SpanKind.INTERNAL, attrs, e.time_ns, parent, links)
        self._runs[e.run_id] = _RunState(e.run_id, span, agent, e.session_id, parent_run_id=e.parent_run_id)
        return span

    def _run_end(self, e: AgentEvent) -> None:
        # Flush what is still open in this run: model nodes complete, tool nodes without a result.
        prefix = f"{e.run_id}|"
        for key in [k for k in self._models if k.startswith(prefix)]:
            self._complete_model(key, e.time_ns, None)
        for key in [k for k in self._tools if k.startswith(prefix)]:
            for node in list(self._tools.pop(key)):
                self._finish_tool(node, e, result=None, error=e.error or "no tool result before run end")
        for key in [k for k in self._retries if k.startswith(prefix)]:
            del self._retries[key]
        run = self._runs.pop(e.run_id, None)
        if run is None:
            return
        self.stats.incr("runs_ended")
        status = e.status or (sc.STATUS_ERROR if e.error else sc.STATUS_COMPLETED)
        span = run.span
        if span is None:
            return
        if e.attributes:
            span.set_attributes(dict(e.attributes))
        done: dict[str, Any] = {}
        if e.payload is not None:
            self._content(sc.GEN_AI_OUTPUT_MESSAGES, dumps(_as_messages(e.payload, "assistant")), [], done)
        done[sc.RUN_STATUS] = str(status)
        if status == sc.STATUS_ERROR:
            span.set_status(Status(StatusCode.ERROR, e.error or None))
            done[sc.ERROR_TYPE] = _error_type(e.error)
        set_valid_attributes(span, done)
        span.end(end_time=e.time_ns)

    # ---- model nodes -----------------------------------------------------------------------
    def _new_model(self, e: AgentEvent, context: Context | None, inputs: Any) -> _ModelNode:
        key = self._step_key(e)
        run = self._runs.get(e.run_id)
        record = NodeRecord(
            record_id=_new_id(), run_id=e.run_id,
            session_id=e.session_id if e.session_id is not None else (run.session_id if run else None),
            turn_id=e.turn_id, step=e.step, node_type=MODEL, node_id=f"model@{key}",
            model_id=e.model, inputs=inputs, started_at_ms=_ms(e.time_ns),
            retry_count=self._retries.get(key, 0),
        )
        prompt = to_plain(inputs)
        model = e.model
        provider = e.provider
        messages: Any = prompt
        system = tools = None
        params: dict[str, Any] = {}
        if (type(prompt) is dict or isinstance(prompt, Mapping)) and ("messages" in prompt or "model" in prompt or "contents" in prompt):
            model = model or prompt.get("model")
            provider = provider or prompt.get("provider")
            messages = prompt.get("messages", prompt.get("contents", prompt.get("input")))
            system = prompt.get("system", prompt.get("system_instruction", prompt.get("instructions")))
            tools = prompt.get("tools")
            params = {k: prompt[k] for k in _REQUEST_PARAMS if k in prompt}
        record.model_id = model
        node = _ModelNode(record, None, provider=provider)
        if self.tracer is not None:
            attrs: dict[str, Any] = {
                sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
                sc.GEN_AI_PROVIDER_NAME: provider,
                sc.GEN_AI_REQUEST_MODEL: model,
                sc.GEN_AI_AGENT_NAME: run.agent if run else e.agent,
                sc.RUN_ID: e.run_id,
                sc.SESSION_ID: record.session_id,
                sc.PARENT_RUN_ID: run.parent_run_id if run else None,
                sc.TURN_ID: e.turn_id,
                sc.STEP: e.step,
                sc.NODE_TYPE: MODEL,
                sc.NODE_ID: record.node_id,
                sc.RECORD_ID: record.record_id,
            }
            for k, v in params.items():
                if isinstance(v, (bool, int, float, str)):
                    attrs[_REQUEST_PARAMS[k]] = v
            if e.attributes:
                attrs.update(e.attributes)
            attrs = _without_none(attrs)
            # Content goes in with the start attributes: one validation pass, no extra span lock.
            if messages is not None:
                self._content(sc.GEN_AI_INPUT_MESSAGES, dumps(convert_messages(messages)), node.truncated, attrs)
            if system:
                self._content(sc.GEN_AI_SYSTEM_INSTRUCTIONS, dumps(system_instructions(system)), node.truncated,
                              attrs)
            if tools:
                self._content(sc.GEN_AI_TOOL_DEFINITIONS, dumps(tool_definitions(tools)), node.truncated, attrs)
            name = f"{sc.OP_CHAT} {model}" if model else sc.OP_CHAT
            bare = not e.attributes and run is not None and run.span is not None
            node.span = self._start_span(name, SpanKind.CLIENT, attrs, e.time_ns, self._parent(e.run_id, context),
                                         bare=bare)
        self._models[key] = node
        return node

    def _model_request(self, e: AgentEvent, context: Context | None) -> Any:
        key = self._step_key(e)
        node = self._models.get(key)
        if node is not None:
            if node.responses == 0 and node.record.inputs is None:
                node.record.inputs = e.payload  # created by an early response: attach the input now
                return node.span
            # A new call in the same step: the previous one is done.
            self._complete_model(key, e.time_ns, None)
        return self._new_model(e, context, e.payload).span

    def _node_for(self, e: AgentEvent) -> _ModelNode:
        node = self._models.get(self._step_key(e))
        if node is None:
            self.stats.incr("orphan_model_responses")
            node = self._new_model(e, None, None)
        return node

    def _model_response(self, e: AgentEvent) -> None:
        node = self._node_for(e)
        node.responses += 1
        if e.model and not node.response_model:
            node.response_model = e.model
        if e.text:
            node.texts.append(e.text)
            node.seq += 1
            if node.span is not None:
                node.span.add_event(sc.EVENT_TEXT, {sc.EVENT_SEQ: node.seq, sc.EVENT_SEGMENT: self._segment(e.text)},
                                    timestamp=e.time_ns)
        raw = to_plain(e.payload)
        if not _is_empty(raw):
            node.record.outputs = raw  # latest non-empty raw payload wins (overwrite)
            info = describe_response(raw)
            if info["model"]:
                node.response_model = info["model"]
            if info["id"]:
                node.response_id = info["id"]
            if info["finish_reason"]:
                node.finish_reason = info["finish_reason"]
            if info["tool_calls"]:
                node.tool_calls = info["tool_calls"]
            if info["reasoning"] and not node.reasoning:
                node.reasoning.append(info["reasoning"])
            if info["text"] and not e.text and not node.texts:
                node.texts.append(info["text"])
            node.usage.merge(parse_usage(raw))
        if e.usage:
            node.usage.merge(parse_usage(to_plain(e.usage)))
        if e.details:
            d = e.details
            if d.get("tool_calls") is not None:
                from otel_agenttape.capture.messages import convert_message

                node.tool_calls = convert_message({"role": "assistant", "tool_calls": list(d["tool_calls"])})["parts"]
            if d.get("finish_reason"):
                node.finish_reason = map_finish_reason(d["finish_reason"])
            if d.get("response_model"):
                node.response_model = d["response_model"]
            if d.get("response_id"):
                node.response_id = d["response_id"]
        if e.attributes and node.span is not None:
            node.span.set_attributes(dict(e.attributes))

    def _model_reasoning(self, e: AgentEvent) -> None:
        node = self._node_for(e)
        if not e.text:
            return
        node.reasoning.append(e.text)
        node.seq += 1
        if node.span is not None:
            node.span.add_event(sc.EVENT_REASONING, {sc.EVENT_SEQ: node.seq, sc.EVENT_SEGMENT: self._segment(e.text)},
                                timestamp=e.time_ns)

    def _model_retry(self, e: AgentEvent) -> None:
        key = self._step_key(e)
        count = self._retries.get(key, 0) + 1
        self._retries[key] = count
        node = self._models.get(key)
        if node is None:
            return
        node.record.retry_count = count
        node.seq += 1
        if node.span is not None:
            attrs: dict[str, Any] = {sc.EVENT_SEQ: node.seq, sc.MODEL_RETRY_COUNT: count}
            if e.text:
                attrs[sc.EVENT_REASON] = e.text
            node.span.add_event(sc.EVENT_RETRY, attrs, timestamp=e.time_ns)

    def _metadata(self, e: AgentEvent) -> None:
        data = dict(to_plain(e.payload) or {}) if isinstance(to_plain(e.payload), Mapping) else {"value": e.payload}
        target = None
        node = self._models.get(self._step_key(e))
        if node is not None:
            node.seq += 1
            target, seq = node.span, node.seq
        else:
            run = self._runs.get(e.run_id)
            target, seq = (run.span if run else None), 0
        if target is not None:
            attrs = {sc.EVENT_SEQ: seq}
            for k, v in data.items():
                attrs[str(k)] = v if isinstance(v, (str, bool, int, float)) else dumps(v)
            target.add_event(sc.EVENT_METADATA, attrs, timestamp=e.time_ns)

    def _step_end(self, e: AgentEvent) -> None:
        key = self._step_key(e)
        self._complete_model(key, e.time_ns, e.error)
        self._retries.pop(key, None)

    def _complete_model(self, key: str, time_ns: int, error: str | None) -> None:
        node = self._models.pop(key, None)
        if node is None:
            return
        rec = node.record
        rec.output_text = "".join(node.texts)
        rec.reasoning_text = "\n".join(node.reasoning)
        rec.input_tokens = node.usage.input_tokens
        rec.output_tokens = node.usage.output_tokens
        rec.captured_at_ms = _ms(time_ns)
        rec.error = error
        span = node.span
        if span is not None:
            if self.sinks:
                rec.trace_id, rec.span_id = _hex_ids(span)
            done: dict[str, Any] = {sc.GEN_AI_RESPONSE_MODEL: _text(node.response_model or rec.model_id or "")}
            if node.response_id:
                done[sc.GEN_AI_RESPONSE_ID] = _text(node.response_id)
            finish = node.finish_reason or ("error" if error else None)
            if node.responses or error is None:
                out = output_messages(rec.output_text, rec.reasoning_text, node.tool_calls, finish)
                self._content(sc.GEN_AI_OUTPUT_MESSAGES, dumps(out), node.truncated, done)
                done[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (_text(out[0]["finish_reason"]),)
            if rec.outputs is not None:
                self._content(sc.MODEL_RAW_OUTPUT, payload_text(rec.outputs), node.truncated, done)
            if rec.output_text:
                self._content(sc.MODEL_OUTPUT_TEXT, rec.output_text, node.truncated, done)
            if rec.reasoning_text:
                self._content(sc.MODEL_REASONING, rec.reasoning_text, node.truncated, done)
            done[sc.MODEL_RETRY_COUNT] = rec.retry_count
            u = node.usage
            for attr, value in ((sc.GEN_AI_USAGE_INPUT_TOKENS, u.input_tokens),
                                (sc.GEN_AI_USAGE_OUTPUT_TOKENS, u.output_tokens),
                                (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, u.cache_read_input_tokens),
                                (sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS, u.cache_write_input_tokens),
                                (sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, u.reasoning_output_tokens)):
                if value != ABSENT:
                    done[attr] = value
            if node.truncated:
                done[sc.TRUNCATED] = tuple(node.truncated)
            if error:
                span.set_status(Status(StatusCode.ERROR, error))
                done[sc.ERROR_TYPE] = _error_type(error)
            set_valid_attributes(span, done)
            span.end(end_time=time_ns)
        self._emit_record(rec)

    # ---- tool nodes ------------------------------------------------------------------------
    def _tool_key(self, e: AgentEvent, part: str) -> str:
        return f"{self._step_key(e)}|{part}"

    def _tool_call(self, e: AgentEvent, context: Context | None, pair: str | None = None) -> Any:
        part = pair or e.call_id or e.tool_name or "anon"
        key = self._tool_key(e, part)
        node = self._new_tool(e, key, part, context, e.payload, with_input=True)
        self._tools.setdefault(key, deque()).append(node)
        return node.span

    def _new_tool(self, e: AgentEvent, key: str, part: str, context: Context | None, arguments: Any,
                  *, with_input: bool) -> _ToolNode:
        run = self._runs.get(e.run_id)
        record = NodeRecord(
            record_id=_new_id(), run_id=e.run_id,
            session_id=e.session_id if e.session_id is not None else (run.session_id if run else None),
            turn_id=e.turn_id, step=e.step, node_type=TOOL, node_id=f"tool@{key}",
            tool_name=e.tool_name, call_id=e.call_id, inputs=arguments if with_input else None,
            started_at_ms=_ms(e.time_ns),
        )
        node = _ToolNode(record, None, key)
        if self.tracer is None:
            return node
        attrs: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: e.tool_name,
            sc.GEN_AI_TOOL_CALL_ID: e.call_id,
            sc.GEN_AI_TOOL_TYPE: "function",
            sc.GEN_AI_AGENT_NAME: run.agent if run else e.agent,
            sc.RUN_ID: e.run_id,
            sc.SESSION_ID: record.session_id,
            sc.PARENT_RUN_ID: run.parent_run_id if run else None,
            sc.TURN_ID: e.turn_id,
            sc.STEP: e.step,
            sc.NODE_TYPE: TOOL,
            sc.NODE_ID: record.node_id,
            sc.RECORD_ID: record.record_id,
        }
        if e.attributes:
            attrs.update(e.attributes)
        attrs = _without_none(attrs)
        if with_input and arguments is not None:
            self._content(sc.GEN_AI_TOOL_CALL_ARGUMENTS, payload_text(to_plain(arguments)), node.truncated, attrs)
        name = f"{sc.OP_EXECUTE_TOOL} {e.tool_name}" if e.tool_name else sc.OP_EXECUTE_TOOL
        bare = not e.attributes and run is not None and run.span is not None
        node.span = self._start_span(name, SpanKind.INTERNAL, attrs, e.time_ns, self._parent(e.run_id, context),
                                     bare=bare)
        return node

    def _pop_tool(self, e: AgentEvent, pair: str | None = None) -> _ToolNode | None:
        candidates = [pair] if pair else [p for p in (e.call_id, e.tool_name, "anon") if p]
        for part in candidates:
            queue = self._tools.get(self._tool_key(e, part))
            if queue:
                node = queue.popleft()
                if not queue:
                    del self._tools[node.key]
                return node
        if not e.call_id and not pair:
            # Result without a call id: the oldest open call of that tool in this step.
            prefix = self._step_key(e) + "|"
            for key, queue in self._tools.items():
                if key.startswith(prefix) and queue and queue[0].record.tool_name == e.tool_name:
                    node = queue.popleft()
                    if not queue:
                        del self._tools[key]
                    return node
        return None

    def _tool_result(self, e: AgentEvent, pair: str | None = None) -> None:
        node = self._pop_tool(e, pair)
        if node is None:
            self.stats.incr("orphan_tool_results")
            part = pair or e.call_id or e.tool_name or "anon"
            node = self._new_tool(e, self._tool_key(e, part), part, None, None, with_input=False)
        self._finish_tool(node, e, result=e.payload, error=e.error)

    def _finish_tool(self, node: _ToolNode, e: AgentEvent, *, result: Any, error: str | None) -> None:
        rec = node.record
        if rec.tool_name is None and e.tool_name:
            rec.tool_name = e.tool_name
        if rec.call_id is None and e.call_id:
            rec.call_id = e.call_id
        rec.outputs = to_plain(result)
        rec.output_text = result if isinstance(result, str) else ""
        rec.captured_at_ms = _ms(e.time_ns)
        rec.error = error
        span = node.span
        if span is not None:
            if self.sinks:
                rec.trace_id, rec.span_id = _hex_ids(span)
            attrs = getattr(span, "attributes", None) or {}
            done: dict[str, Any] = {}
            if rec.tool_name and e.tool_name and not attrs.get(sc.GEN_AI_TOOL_NAME):
                done[sc.GEN_AI_TOOL_NAME] = _text(rec.tool_name)
                span.update_name(f"{sc.OP_EXECUTE_TOOL} {rec.tool_name}")
            if rec.call_id and not attrs.get(sc.GEN_AI_TOOL_CALL_ID):
                done[sc.GEN_AI_TOOL_CALL_ID] = _text(rec.call_id)
            if error:
                self._content(sc.TOOL_ERROR, error, node.truncated, done)
                span.set_status(Status(StatusCode.ERROR, error))
                done[sc.ERROR_TYPE] = _error_type(error)
            elif result is not None:
                self._content(sc.GEN_AI_TOOL_CALL_RESULT, payload_text(rec.outputs), node.truncated, done)
            if node.truncated:
                done[sc.TRUNCATED] = tuple(node.truncated)
            if done:
                set_valid_attributes(span, done)
            span.end(end_time=e.time_ns)
        self._emit_record(rec)


_HANDLERS: dict[EventType, Any] = {
    EventType.RUN_START: lambda self, e, context, links, pair: self._run_start(e, context, links),
    EventType.RUN_END: lambda self, e, context, links, pair: self._run_end(e),
    EventType.MODEL_REQUEST: lambda self, e, context, links, pair: self._model_request(e, context),
    EventType.MODEL_RESPONSE: lambda self, e, context, links, pair: self._model_response(e),
    EventType.MODEL_REASONING: lambda self, e, context, links, pair: self._model_reasoning(e),
    EventType.MODEL_RETRY: lambda self, e, context, links, pair: self._model_retry(e),
    EventType.STEP_END: lambda self, e, context, links, pair: self._step_end(e),
    EventType.TOOL_CALL: lambda self, e, context, links, pair: self._tool_call(e, context, pair),
    EventType.TOOL_RESULT: lambda self, e, context, links, pair: self._tool_result(e, pair),
    EventType.METADATA: lambda self, e, context, links, pair: self._metadata(e),
}


def _without_none(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if v is not None}


def _text(value: Any) -> str:
    return value if type(value) is str else str(value)


def _is_empty(raw: Any) -> bool:
    return raw is None or raw == "" or (isinstance(raw, (dict, list, tuple)) and len(raw) == 0)


def _error_type(error: str | None) -> str:
    if not error:
        return "_OTHER"
    head = error.split(":", 1)[0].strip()
    return head if head and " " not in head and len(head) <= 64 else "_OTHER"


def _as_messages(value: Any, role: str) -> list[dict[str, Any]]:
    value = to_plain(value)
    if isinstance(value, list) and all(isinstance(m, Mapping) and "role" in m for m in value):
        return convert_messages(value)
    if isinstance(value, Mapping) and "role" in value:
        return convert_messages([value])
    text = value if isinstance(value, str) else payload_text(value)
    return [{"role": role, "parts": [{"type": "text", "content": text}]}]

