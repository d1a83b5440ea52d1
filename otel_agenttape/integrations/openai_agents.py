"""The OpenAI Agents SDK recorded as a tape: a ``TracingProcessor`` that turns the SDK's own spans
into capture events.

    from agents import set_trace_processors
    set_trace_processors([AgentTapeProcessor(tape)])    # replaces the SDK's uploader

What maps to what: an agent span is a run (``invoke_agent {agent}``); a generation or response span
is a model node with its prompt, output, tool calls and usage; a function span is a tool node with
the model's exact arguments and call id; a handoff is a tool node (the model's ``transfer_to_...``
call) and the agent it hands to is a child run under it; an agent used as a tool is a child run
under that tool node; a guardrail is an ``agenttape.metadata`` event on its run. The SDK trace's
``group_id`` is the session; ``metadata["agenttape.run.id"]`` names the first run of a trace
(otherwise the SDK's trace id names it, and later runs their SDK span ids).

Generation, response, handoff and guardrail spans have no children, so they are recorded when they
end, with the SDK's start and end times; agent and function spans start a span at once and make it
current, so spans of other instrumentations inside a tool (an MCP client, an HTTP client) nest under
it.

A model call is recorded once: the OpenAI SDK's instrumentation, when it is on too (zero code), skips
its own span inside a generation or response span this processor records (``capture.model_calls``).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_agenttape import semconv as sc
from otel_agenttape.capture import model_calls
from otel_agenttape.capture.api import current_run
from otel_agenttape.capture.events import AgentEvent, EventType

from ._agents_content import chat_messages, dump, error_text, split_system, text_of, tool_calls
from ._common import Attached, guarded, iso_ns, parse_json

try:
    from agents.tracing import TracingProcessor
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError('the OpenAI Agents SDK is needed: pip install "otel-agenttape[openai-agents]"') from exc

FRAMEWORK = "openai-agents"
RUN_ID_KEY = "agenttape.run.id"
SESSION_ID_KEY = "agenttape.session.id"


@dataclass
class _AgentRun:
    run_id: str
    agent: str
    session_id: str | None
    span: Any
    scope: Attached | None
    step: int = 0
    output: Any = None
    trace_id: str = ""
    pending: deque = field(default_factory=deque)  # tool calls the last model call asked for
    handed_from: "_AgentRun | None" = None  # the run that handed off to this one
    handing_off: bool = False  # handed off: ends when the agent it handed to ends
    deferred: tuple[int | None, str | None, dict[str, Any]] | None = None
    tripped: str | None = None  # a guardrail that tripped: the SDK raises, the run failed


@dataclass
class _Open:
    """An SDK span we started an OTel span for (agent or function), for parenting its children."""

    kind: str
    run: _AgentRun
    span: Any
    scope: Attached | None = None
    call: dict[str, Any] | None = None
    pair: str | None = None


class AgentTapeProcessor(TracingProcessor):
    """Records every Agents SDK trace it sees as tapes through ``tape``'s capture listener.

    ``session_id`` is used when a trace has no ``group_id``. Register it with
    ``agents.set_trace_processors([processor])`` (the SDK's own uploader then never runs) or
    ``agents.add_trace_processor(processor)``. Every callback is guarded: a failure here is counted
    in ``tape.stats()["listener_errors"]`` and never reaches the agent.
    """

    def __init__(self, tape: Any, *, session_id: str | None = None, provider: str = "openai") -> None:
        self.tape = tape
        self.listener = tape.listener
        self._stats = tape.listener.stats
        self.session_id = session_id
        self.provider = provider
        self._lock = threading.RLock()
        self._traces: dict[str, Any] = {}
        self._open: dict[str, _Open] = {}
        self._parents: dict[str, tuple[str | None, str]] = {}  # SDK span id -> (parent id, trace id)
        self._roots: set[str] = set()  # traces whose first run has started
        self._handoffs: dict[str, list[tuple[_AgentRun, str, Any]]] = {}

    # ---- TracingProcessor ------------------------------------------------------------------
    @guarded
    def on_trace_start(self, trace_obj: Any) -> None:
        with self._lock:
            self._traces[trace_obj.trace_id] = trace_obj

    @guarded
    def on_trace_end(self, trace_obj: Any) -> None:
        with self._lock:
            self._traces.pop(trace_obj.trace_id, None)
            self._roots.discard(trace_obj.trace_id)
            for from_run, _, _ in self._handoffs.pop(trace_obj.trace_id, None) or []:
                from_run.handing_off = False  # the agent it handed to never started
                if from_run.deferred is not None:
                    self._finish(from_run)
            # spans of this trace that never ended (an SDK span ends before its trace does)
            for sid in [s for s, (_, t) in self._parents.items() if t == trace_obj.trace_id]:
                self._parents.pop(sid, None)
                self._open.pop(sid, None)

    @guarded
    def on_span_start(self, span: Any) -> None:
        kind = span.span_data.type
        model_calls.agents_call_started(span)  # the OpenAI SDK's own span inside it is not recorded again
        with self._lock:
            self._parents[span.span_id] = (span.parent_id, span.trace_id)
            if kind == "agent":
                self._agent_start(span)
            elif kind == "function":
                self._function_start(span)

    @guarded
    def on_span_end(self, span: Any) -> None:
        kind = span.span_data.type
        model_calls.agents_call_ended(span)
        with self._lock:
            if kind == "agent":
                self._agent_end(span)
            elif kind == "function":
                self._function_end(span)
            elif kind == "generation":
                self._generation(span)
            elif kind == "response":
                self._response(span)
            elif kind == "handoff":
                self._handoff(span)
            elif kind == "guardrail":
                self._guardrail(span)
            if span.span_id not in self._open:
                self._parents.pop(span.span_id, None)

    def shutdown(self) -> None:
        """The SDK calls this at exit: export what is queued (the tape itself stays the caller's)."""
        self.force_flush()

    def force_flush(self) -> None:
        try:
            self.tape.force_flush()
        except Exception:
            self._stats.incr("listener_errors")

    # ---- ancestry --------------------------------------------------------------------------
    def _enclosing(self, span: Any) -> _Open | None:
        """The nearest ancestor SDK span we hold an OTel span for."""
        seen: set[str] = set()
        cur = span.parent_id
        while cur and cur not in seen:
            seen.add(cur)
            found = self._open.get(cur)
            if found is not None:
                return found
            cur = (self._parents.get(cur) or (None, ""))[0]
        return None

    def _run_of(self, span: Any) -> _AgentRun | None:
        found = self._enclosing(span)
        return found.run if found is not None else None

    def _event(self, kind: EventType, run: _AgentRun, time_ns: int | None, **fields: Any) -> AgentEvent:
        event = AgentEvent(kind, run.run_id, run.session_id, None, agent=run.agent, **fields)
        if time_ns:
            event.time_ns = time_ns
        return event

    # ---- runs ------------------------------------------------------------------------------
    def _agent_start(self, span: Any) -> None:
        data = span.span_data
        trace_obj = self._traces.get(span.trace_id)
        metadata = dict(getattr(trace_obj, "metadata", None) or {})
        session = getattr(trace_obj, "group_id", None) or metadata.get(SESSION_ID_KEY) or self.session_id
        parent = self._enclosing(span)
        parent_run_id = None
        context = None
        if parent is not None:
            context = trace.set_span_in_context(parent.span)
            parent_run_id = parent.run.run_id
            session = session or parent.run.session_id
        handoff = None
        if parent is None:
            handoff = self._take_handoff(span.trace_id, data.name)
            if handoff is not None:
                from_run, tool_span = handoff
                context = trace.set_span_in_context(tool_span if tool_span is not None else from_run.span)
                parent_run_id = from_run.run_id
                session = session or from_run.session_id
            else:
                outer = current_run()  # the SDK run inside a run of the capture API
                if outer is not None:
                    parent_run_id = outer.run_id
                    session = session or outer.session_id
        if parent is None and handoff is None and span.trace_id not in self._roots:
            # the trace's first agent (also when it runs inside a run of the capture API)
            self._roots.add(span.trace_id)
            run_id = str(metadata.get(RUN_ID_KEY) or span.trace_id)
        else:
            run_id = span.span_id
        run = _AgentRun(run_id, data.name, session, None, None, trace_id=span.trace_id)
        if parent is None and handoff is not None:
            run.handed_from = handoff[0]
        event = self._event(EventType.RUN_START, run, iso_ns(span.started_at), parent_run_id=parent_run_id,
                            attributes={sc.FRAMEWORK: FRAMEWORK})
        run.span = self.listener.dispatch(event, context=context if context is not None else otel_context.get_current())
        run.scope = Attached(run.span)
        self._open[span.span_id] = _Open("agent", run, run.span, run.scope)

    def _agent_end(self, span: Any) -> None:
        opened = self._open.pop(span.span_id, None)
        if opened is None:
            return
        run = opened.run
        if opened.scope is not None:
            opened.scope.release()
        error = error_text(span.error)
        if error is None and run.tripped:
            error = f"GuardrailTripwireTriggered: guardrail {run.tripped} triggered"
        extra = {}
        tools = list(getattr(span.span_data, "tools", None) or [])
        handoffs = list(getattr(span.span_data, "handoffs", None) or [])
        if tools:
            extra[sc.FRAMEWORK_AGENT_TOOLS] = tools
        if handoffs:
            extra[sc.FRAMEWORK_AGENT_HANDOFFS] = handoffs
        run.deferred = (iso_ns(span.ended_at), error, extra)
        if not run.handing_off:
            self._finish(run)

    def _finish(self, run: _AgentRun) -> None:
        """End a run; a run that handed off to this one ends with it and answers with its answer."""
        end_ns, error, extra = run.deferred or (None, None, {})
        run.deferred = None
        self.listener.dispatch(self._event(
            EventType.RUN_END, run, end_ns, payload=run.output,
            status=sc.STATUS_ERROR if error else sc.STATUS_COMPLETED, error=error, attributes=extra or None))
        parent = run.handed_from
        if parent is not None:
            parent.handing_off = False
            if parent.output is None:
                parent.output = run.output
            if parent.deferred is not None:
                p_end, p_error, p_extra = parent.deferred
                parent.deferred = (max(p_end or 0, end_ns or 0) or None, p_error, p_extra)
                self._finish(parent)

    def _take_handoff(self, trace_id: str, agent: str) -> tuple[_AgentRun, Any] | None:
        pending = self._handoffs.get(trace_id) or []
        for i, (from_run, to_agent, tool_span) in enumerate(pending):
            if to_agent == agent:
                del pending[i]
                return from_run, tool_span
        return None

    # ---- model nodes -----------------------------------------------------------------------
    def _model(self, span: Any, model: Any, messages: list[Any], system: str | None, output: list[Any],
               text: str, usage: Any, raw: Any, params: Any) -> None:
        run = self._run_of(span)
        if run is None:
            return
        run.step += 1
        step = run.step
        head, rest = split_system(messages)
        system = system or head
        request: dict[str, Any] = {"model": model, "messages": rest}
        if system:
            request["system"] = system
        for key, value in (params or {}).items():
            if value is not None and key in ("temperature", "top_p", "max_tokens"):
                request[key] = value
        calls = tool_calls(output)
        error = error_text(span.error)
        start, end = iso_ns(span.started_at), iso_ns(span.ended_at)
        self.listener.dispatch(self._event(EventType.MODEL_REQUEST, run, start, step=step, payload=request,
                                           model=model, provider=self.provider),
                               context=trace.set_span_in_context(run.span))
        if output or usage or raw is not None:
            self.listener.dispatch(self._event(
                EventType.MODEL_RESPONSE, run, end, step=step, text=text or None, payload=raw, usage=usage or None,
                details={"tool_calls": calls} if calls else None))
        self.listener.dispatch(self._event(EventType.STEP_END, run, end, step=step, error=error))
        run.pending = deque(calls)
        if output and not calls:
            run.output = text
        elif calls:
            run.output = None

    def _generation(self, span: Any) -> None:
        data = span.span_data
        messages = [dump(m) for m in data.input or []]
        output = [dump(m) for m in data.output or []]
        self._model(span, data.model, messages, None, output, text_of(output), data.usage,
                    {"output": output} if output else None, data.model_config)

    def _response(self, span: Any) -> None:
        data = span.span_data
        response = data.response
        if response is None:
            self._model(span, None, chat_messages(data.input), None, [], "", data.usage, None, None)
            return
        output = chat_messages(response.output)
        usage = dump(response.usage) if response.usage is not None else data.usage
        self._model(span, response.model, chat_messages(data.input), response.instructions
                    if isinstance(response.instructions, str) else None, output,
                    response.output_text or text_of(output), usage, dump(response),
                    {"temperature": response.temperature, "top_p": response.top_p,
                     "max_tokens": response.max_output_tokens})

    # ---- tool nodes ------------------------------------------------------------------------
    def _claim(self, run: _AgentRun, name: str) -> dict[str, Any] | None:
        """The model's pending tool call this tool span answers: the oldest of that name."""
        for i, call in enumerate(run.pending):
            if (call.get("function") or {}).get("name") == name:
                del run.pending[i]
                return call
        return None

    def _function_start(self, span: Any) -> None:
        enclosing = self._enclosing(span)
        if enclosing is None:
            return
        run = enclosing.run
        name = span.span_data.name
        call = self._claim(run, name)
        arguments = parse_json((call.get("function") or {}).get("arguments")) if call else None
        attributes = {}
        mcp = getattr(span.span_data, "mcp_data", None)
        if mcp:
            attributes[sc.FRAMEWORK_MCP_SERVER] = str(mcp.get("server", "")) if isinstance(mcp, dict) else str(mcp)
        event = self._event(EventType.TOOL_CALL, run, iso_ns(span.started_at), step=run.step, tool_name=name,
                            call_id=call.get("id") if call else None, payload=arguments,
                            attributes=attributes or None)
        tool_span = self.listener.dispatch(event, context=trace.set_span_in_context(enclosing.span),
                                           pair=span.span_id)
        self._open[span.span_id] = _Open("function", run, tool_span, Attached(tool_span), call, span.span_id)

    def _function_end(self, span: Any) -> None:
        opened = self._open.pop(span.span_id, None)
        if opened is None:
            return
        if opened.scope is not None:
            opened.scope.release()
        data = span.span_data
        run = opened.run
        if data.input and opened.span is not None:
            given = parse_json(data.input)
            claimed = parse_json((opened.call or {}).get("function", {}).get("arguments")) if opened.call else None
            if opened.call is None or given != claimed:
                opened.span.set_attribute(sc.GEN_AI_TOOL_CALL_ARGUMENTS, data.input if isinstance(data.input, str)
                                          else str(data.input))
        error = error_text(span.error)
        self.listener.dispatch(self._event(
            EventType.TOOL_RESULT, run, iso_ns(span.ended_at), step=run.step, tool_name=data.name,
            call_id=opened.call.get("id") if opened.call else None, payload=data.output, error=error),
            pair=opened.pair)

    def _handoff(self, span: Any) -> None:
        data = span.span_data
        enclosing = self._enclosing(span)
        if enclosing is None:
            return
        run = enclosing.run
        to_agent = data.to_agent
        call = None
        for i, c in enumerate(run.pending):
            if str((c.get("function") or {}).get("name", "")).startswith("transfer_to"):
                call = c
                del run.pending[i]
                break
        name = (call.get("function") or {}).get("name") if call else f"transfer_to_{to_agent}"
        arguments = parse_json((call.get("function") or {}).get("arguments")) if call else {}
        pair = span.span_id
        tool_span = self.listener.dispatch(self._event(
            EventType.TOOL_CALL, run, iso_ns(span.started_at), step=run.step, tool_name=name,
            call_id=call.get("id") if call else None, payload=arguments,
            attributes={sc.FRAMEWORK_HANDOFF_TO: str(to_agent)} if to_agent else None),
            context=trace.set_span_in_context(enclosing.span), pair=pair)
        error = error_text(span.error)
        self.listener.dispatch(self._event(
            EventType.TOOL_RESULT, run, iso_ns(span.ended_at), step=run.step, tool_name=name,
            call_id=call.get("id") if call else None, payload={"assistant": to_agent}, error=error), pair=pair)
        if to_agent and not error:
            self._handoffs.setdefault(span.trace_id, []).append((run, to_agent, tool_span))
            run.handing_off = True

    def _guardrail(self, span: Any) -> None:
        run = self._run_of(span)
        if run is None:
            return
        data = span.span_data
        if data.triggered:
            run.tripped = data.name
        self.listener.dispatch(self._event(EventType.METADATA, run, iso_ns(span.ended_at), step=-1,
                                           payload={"guardrail": data.name, "triggered": bool(data.triggered)}))


def instrument_openai_agents(tape: Any, *, replace: bool = True, **kwargs: Any) -> AgentTapeProcessor:
    """Register an ``AgentTapeProcessor``: with ``replace`` (the default) it is the only processor,
    so the SDK's default uploader to the OpenAI platform never runs."""
    from agents import add_trace_processor, set_trace_processors

    processor = AgentTapeProcessor(tape, **kwargs)
    if replace:
        set_trace_processors([processor])
    else:
        add_trace_processor(processor)
    return processor
