"""Events -> node records and GenAI spans: the listener every runtime feeds, and its event dispatch.

Each event type has one handler here, which composes the two parts that hold the rules: ``nodes``
(which events pair into a node, and what a node accumulates: streamed text, reasoning, usage,
retries) and ``span_mapping`` (which span a run or node gets, with which attributes and events).
Completed nodes go to the record sinks (``sinks.RecordFanout``), redacted as the spans are.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link

from otel_agenttape import semconv as sc
from otel_agenttape.capture.events import AgentEvent, EventType
from otel_agenttape.capture.nodes import ModelNode, OpenNodes, RunState, ToolNode, step_key, tool_key, tool_part
from otel_agenttape.capture.records import MODEL, NodeRecord
from otel_agenttape.capture.redact import Redactor
from otel_agenttape.capture.sinks import NodeSink, RecordFanout
from otel_agenttape.capture.span_mapping import PayloadContent, SpanMapper
from otel_agenttape.capture.stats import CaptureStats
from otel_agenttape.codec.jsontext import to_plain


def _hex_ids(span: Any) -> tuple[str | None, str | None]:
    ctx = span.get_span_context() if span is not None else None
    if ctx is None or not ctx.is_valid:
        return None, None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


class CaptureListener:
    """Consumes AgentEvents from any runtime. Never raises: failures are counted in ``stats``.

    ``tracer`` None records node records only (no spans). ``spans`` maps runs and nodes to spans;
    ``open`` holds what has started and not completed (both read under the listener's lock only).
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
        self.spans = SpanMapper(tracer, PayloadContent(redactor, max_payload_chars, self.stats))
        self.open = OpenNodes()
        self._records = RecordFanout(self.sinks, redactor, self.stats)
        self._lock = threading.RLock()

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
                t = event.type if type(event.type) is EventType else EventType(str(event.type))
                return _HANDLERS[t](self, event, context, links, pair)
        except Exception:
            self.stats.incr("listener_errors")
            return None

    def add_sink(self, sink: NodeSink) -> None:
        self.sinks.append(sink)

    def pending(self) -> dict[str, int]:
        """Open runs and nodes (for diagnostics)."""
        with self._lock:
            return self.open.counts()

    # ---- records ---------------------------------------------------------------------------
    def _emit(self, record: NodeRecord, span: Any) -> None:
        """A completed node: counted, and written to the sinks (with its span's ids)."""
        stats = self.stats
        stats.incr("nodes_captured")
        stats.incr("model_nodes" if record.node_type == MODEL else "tool_nodes")
        if self.sinks:
            if span is not None:
                record.trace_id, record.span_id = _hex_ids(span)
            self._records.write(record)

    # ---- runs ------------------------------------------------------------------------------
    def _run_start(self, e: AgentEvent, context: Context | None, links: Sequence[Link]) -> Any:
        runs = self.open.runs
        existing = runs.get(e.run_id)
        if existing is not None:
            return existing.span
        self.stats.incr("runs_started")
        if context is None and e.parent_run_id and e.parent_run_id in runs:
            context = trace.set_span_in_context(runs[e.parent_run_id].span)
        span = self.spans.start_run(e, context, links)
        runs[e.run_id] = RunState(e.run_id, span, e.agent, e.session_id, parent_run_id=e.parent_run_id)
        return span

    def _run_end(self, e: AgentEvent) -> None:
        # Flush what is still open in this run: model nodes complete, tool nodes without a result.
        model_keys, tools, run = self.open.close_run(e.run_id)
        for key in model_keys:
            self._complete_model(key, e.time_ns, None)
        for node in tools:
            self._complete_tool(node, e, result=None, error=e.error or "no tool result before run end")
        if run is None:
            return
        self.stats.incr("runs_ended")
        status = e.status or (sc.STATUS_ERROR if e.error else sc.STATUS_COMPLETED)
        if run.span is not None:
            self.spans.end_run(run.span, e, status)

    # ---- model nodes -----------------------------------------------------------------------
    def _new_model(self, e: AgentEvent, context: Context | None, inputs: Any) -> ModelNode:
        key = step_key(e)
        node, request = self.open.new_model(e, key, inputs)
        node.span = self.spans.start_model(node, request, e, self.open.runs.get(e.run_id), context)
        self.open.models[key] = node
        return node

    def _model_request(self, e: AgentEvent, context: Context | None) -> Any:
        key = step_key(e)
        node = self.open.models.get(key)
        if node is not None:
            if node.responses == 0 and node.record.inputs is None:
                node.record.inputs = e.payload  # created by an early response: attach the input now
                return node.span
            # A new call in the same step: the previous one is done.
            self._complete_model(key, e.time_ns, None)
        return self._new_model(e, context, e.payload).span

    def _node_for(self, e: AgentEvent) -> ModelNode:
        node = self.open.models.get(step_key(e))
        if node is None:
            self.stats.incr("orphan_model_responses")
            node = self._new_model(e, None, None)
        return node

    def _model_response(self, e: AgentEvent) -> None:
        node = self._node_for(e)
        node.note_response(e.model)
        if e.text:
            self.spans.segment_event(node.span, sc.EVENT_TEXT, node.add_text(e.text), e.text, e.time_ns)
        node.absorb(e)
        self.spans.add_attributes(node.span, e.attributes)

    def _model_reasoning(self, e: AgentEvent) -> None:
        node = self._node_for(e)
        if e.text:
            self.spans.segment_event(node.span, sc.EVENT_REASONING, node.add_reasoning(e.text), e.text, e.time_ns)

    def _model_retry(self, e: AgentEvent) -> None:
        key = step_key(e)
        count = self.open.count_retry(key)
        node = self.open.models.get(key)
        if node is not None:
            node.record.retry_count = count
            self.spans.retry_event(node.span, node.next_seq(), count, e.text, e.time_ns)

    def _metadata(self, e: AgentEvent) -> None:
        data = dict(to_plain(e.payload) or {}) if isinstance(to_plain(e.payload), Mapping) else {"value": e.payload}
        node = self.open.models.get(step_key(e))
        if node is not None:
            self.spans.metadata_event(node.span, node.next_seq(), data, e.time_ns)
        else:
            run = self.open.runs.get(e.run_id)
            self.spans.metadata_event(run.span if run else None, 0, data, e.time_ns)

    def _step_end(self, e: AgentEvent) -> None:
        key = step_key(e)
        self._complete_model(key, e.time_ns, e.error)
        self.open.retries.pop(key, None)

    def _complete_model(self, key: str, time_ns: int, error: str | None) -> None:
        node = self.open.models.pop(key, None)
        if node is None:
            return
        record = node.complete(time_ns, error)
        if node.span is not None:
            self.spans.end_model(node, error, time_ns)
        self._emit(record, node.span)

    # ---- tool nodes ------------------------------------------------------------------------
    def _new_tool(self, e: AgentEvent, key: str, context: Context | None, arguments: Any) -> ToolNode:
        node = self.open.new_tool(e, key, arguments)
        node.span = self.spans.start_tool(node, e, self.open.runs.get(e.run_id), context)
        return node

    def _tool_call(self, e: AgentEvent, context: Context | None, pair: str | None = None) -> Any:
        node = self._new_tool(e, tool_key(e, tool_part(e, pair)), context, e.payload)
        self.open.push_tool(node)
        return node.span

    def _tool_result(self, e: AgentEvent, pair: str | None = None) -> None:
        node = self.open.pop_tool(e, pair)
        if node is None:
            self.stats.incr("orphan_tool_results")
            node = self._new_tool(e, tool_key(e, tool_part(e, pair)), None, None)
        self._complete_tool(node, e, result=e.payload, error=e.error)

    def _complete_tool(self, node: ToolNode, e: AgentEvent, *, result: Any, error: str | None) -> None:
        record = node.complete(e, result, error)
        if node.span is not None:
            self.spans.end_tool(node, e, result, error)
        self._emit(record, node.span)


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
