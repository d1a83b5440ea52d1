"""Context-manager API for code that is its own agent runtime.

Every call turns into AgentEvents for the same listener a foreign runtime would feed, so both paths
produce identical spans and records. Exceptions in user code mark the node and run ``error`` and are
re-raised unchanged; capture's own failures are counted and swallowed.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
import uuid
from typing import Any, Mapping, MutableMapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link

from otel_agenttape import semconv as sc
from otel_agenttape.capture.events import AgentEvent, EventType
from otel_agenttape.capture.listener import CaptureListener
from otel_agenttape.capture.propagation import RemoteParent, extract_context, inject_context
from otel_agenttape.capture.scores import ScoreError, score_attributes, score_span_or_own

_log = logging.getLogger(__name__)
_current_run: contextvars.ContextVar["Run | None"] = contextvars.ContextVar("agenttape_current_run", default=None)


def current_run() -> "Run | None":
    """The innermost run entered in this context (thread / asyncio task), if any."""
    return _current_run.get()


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_cancel(exc: BaseException) -> bool:
    return isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, GeneratorExit))


class _Scope:
    """Makes a span current for the duration of a with-block (so nested spans parent to it)."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token: object | None = None

    def enter(self, span: Any) -> None:
        if span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(span))

    def exit(self) -> None:
        if self._token is not None:
            try:
                otel_context.detach(self._token)
            except Exception:
                pass
            self._token = None


class Run:
    """One agent invocation: ``with tape.run(agent="planner") as run: ...``."""

    def __init__(self, listener: CaptureListener, agent: str | None = None, *, run_id: str | None = None,
                 session_id: str | None = None, turn_id: str | None = "1", input: Any = None,
                 parent: "Run | RemoteParent | Mapping[str, str] | None" = None, same_trace: bool = False,
                 follows: "Mapping[str, str] | None" = None,
                 model: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
        self.listener = listener
        self.agent = agent
        self.run_id = run_id or uuid.uuid4().hex
        self.session_id = session_id
        self.turn_id = turn_id
        self.input = input
        self.output: Any = None
        self.parent = parent
        self.same_trace = same_trace
        self.follows = follows  # the previous run of the same session (a carrier), not a parent
        self.previous_run_id: str | None = None
        self.model = model
        self.attributes = dict(attributes or {})
        self.parent_run_id: str | None = None
        self.status: str | None = None
        self.span: Any = None
        self._step = 0
        self._unnamed = itertools.count(1)
        self._lock = threading.Lock()
        self._scope = _Scope()
        self._run_token: contextvars.Token | None = None
        self._open_nodes: set[Any] = set()  # spans of this run's nodes still open

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "Run":
        try:
            context, links = self._parent_context()
            self.span = self.listener.dispatch(
                AgentEvent(EventType.RUN_START, self.run_id, self.session_id, self.turn_id, None,
                           payload=self.input, agent=self.agent, model=self.model,
                           parent_run_id=self.parent_run_id, attributes=self.attributes or None),
                context=context, links=links)
            self._scope.enter(self.span)
        except Exception:
            self.listener.stats.incr("api_errors")
        self._run_token = _current_run.set(self)
        return self

    def _parent_context(self) -> tuple[Context, list[Link]]:
        parent = self.parent
        if parent is None and self.follows:
            # A later turn of a session: its own root, linked to the run it continues.
            prev = extract_context(self.follows)
            if self.session_id is None:
                self.session_id = prev.session_id
            if prev.run_id:
                self.previous_run_id = prev.run_id
                self.attributes.setdefault(sc.PREVIOUS_RUN_ID, prev.run_id)
            links = [Link(prev.span_context, {sc.PREVIOUS_RUN_ID: prev.run_id or ""})] if prev.span_context else []
            return Context(), links
        if parent is None:
            outer = _current_run.get()
            if outer is not None:
                self.parent_run_id = outer.run_id
                if self.session_id is None:
                    self.session_id = outer.session_id
            return otel_context.get_current(), []
        if isinstance(parent, Run):
            self.parent_run_id = parent.run_id
            if self.session_id is None:
                self.session_id = parent.session_id
            ctx = trace.set_span_in_context(parent.span) if parent.span is not None else otel_context.get_current()
            return ctx, []
        remote = extract_context(parent)
        self.parent_run_id = remote.run_id
        if self.session_id is None:
            self.session_id = remote.session_id
        links = [Link(remote.span_context, {sc.PARENT_RUN_ID: remote.run_id or ""})] if remote.span_context else []
        # A child run in another process starts its own trace and links to the parent run span;
        # same_trace=True makes it a child span of the remote parent instead.
        return (remote.context if self.same_trace else Context()), links

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None:
            status, error = sc.STATUS_COMPLETED, None
        elif _is_cancel(exc):
            status, error = sc.STATUS_CANCELLED, _error_text(exc)
        else:
            status, error = sc.STATUS_ERROR, _error_text(exc)
        if self.status in sc.RUN_STATUSES and exc is None:
            status = self.status  # explicitly set (e.g. truncated)
        self.status = status
        try:
            self.listener.dispatch(AgentEvent(EventType.RUN_END, self.run_id, self.session_id, self.turn_id, None,
                                              payload=self.output, status=status, error=error, agent=self.agent))
        except Exception:
            self.listener.stats.incr("api_errors")
        self._scope.exit()
        if self._run_token is not None:
            try:
                _current_run.reset(self._run_token)
            except ValueError:
                _current_run.set(None)
            self._run_token = None
        return False

    async def __aenter__(self) -> "Run":
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        return self.__exit__(exc_type, exc, tb)

    # ---- nodes -----------------------------------------------------------------------------
    def next_step(self) -> int:
        with self._lock:
            self._step += 1
            return self._step

    @property
    def step(self) -> int:
        return self._step

    def model_call(self, model: str | None = None, messages: Any = None, *, provider: str | None = None,
                   system: Any = None, tools: Any = None, step: int | None = None, turn_id: str | None = None,
                   attributes: Mapping[str, Any] | None = None, **params: Any) -> "ModelCall":
        """A model node. ``messages`` as the OpenAI/Anthropic/Gemini SDKs take them; ``params`` such as
        temperature or max_tokens become gen_ai.request.* attributes."""
        return ModelCall(self, model, messages, provider=provider, system=system, tools=tools, step=step,
                         turn_id=turn_id, attributes=attributes, params=params)

    def tool_call(self, name: str, arguments: Any = None, *, call_id: str | None = None, step: int | None = None,
                  turn_id: str | None = None, attributes: Mapping[str, Any] | None = None) -> "ToolCall":
        """A tool node; ``call_id`` is the id of the model's tool_call part it answers."""
        return ToolCall(self, name, arguments, call_id=call_id, step=step, turn_id=turn_id, attributes=attributes)

    def child(self, agent: str | None = None, **kwargs: Any) -> "Run":
        """A nested run for a child agent (a coordinator's specialist)."""
        kwargs.setdefault("session_id", self.session_id)
        return Run(self.listener, agent, parent=self, **kwargs)

    def set_output(self, value: Any) -> None:
        """The run's final output (gen_ai.output.messages on the run span)."""
        self.output = value

    def metadata(self, **values: Any) -> None:
        """An agenttape.metadata span event on the run span."""
        self.listener.dispatch(AgentEvent(EventType.METADATA, self.run_id, self.session_id, self.turn_id,
                                          -1, payload=values))

    def inject(self, carrier: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
        """Trace context + run ids for a child run in another process (HTTP headers, env vars)."""
        return inject_context(carrier, run=self)

    def score(self, name: str, value: float | None = None, label: str | None = None,
              explanation: str | None = None, *, source: str = "code", version: str | None = None,
              response_id: str | None = None, error_type: str | None = None) -> bool:
        """A ``gen_ai.evaluation.result`` event for this run: on the run span while the run is open,
        else in a tape of its own naming the run (the sealed run is never edited). ``source``: ``human``,
        ``llm``, ``code`` or an evaluator's name (``NAME@VERSION``, or ``version=``). Never raises into
        the agent: a score given wrongly (no name, neither value nor label) is logged and counted in
        ``scores_invalid``, capture's own failures in ``api_errors``. True when recorded."""
        attrs = self._score_attrs(name, value, label, explanation, source, version, response_id, error_type)
        return self._score(self.span, attrs) if attrs is not None else False

    def _score_attrs(self, *args: Any) -> dict[str, Any] | None:
        try:
            return score_attributes(*args[:4], source=args[4], version=args[5], response_id=args[6],
                                    error_type=args[7])
        except ScoreError as exc:
            _log.warning("agenttape: score not recorded: %s", exc)
            self.listener.stats.incr("scores_invalid")
            return None

    def _score(self, span: Any, attrs: dict[str, Any]) -> bool:
        try:
            ctx = self.span.get_span_context() if self.span is not None else None
            of = f"{self.run_id}@{ctx.trace_id:032x}" if ctx is not None and ctx.is_valid else self.run_id
            return score_span_or_own(getattr(self.listener, "tracer", None), span, self.span, attrs, of=of)
        except Exception:
            self.listener.stats.incr("api_errors")
            return False

    def _node_parent(self) -> Context | None:
        """The context a new node of this run starts in.

        Inside this run's own context (the thread or task that entered it, or one that copied its
        context) the current span is kept, so a node nested in another node parents to it. Anywhere
        else (a pool thread, a task created before the run, a context left over from another run) the
        node goes straight under the run span, in the run's trace.
        """
        span = self.span
        if span is None:
            return None
        if _current_run.get() is self:
            return otel_context.get_current()
        # Only the OTel context was carried over: keep it when its span is this run's (the run span,
        # an open node of the run, or a span started directly under one of them).
        current = trace.get_current_span()
        if current is span:
            return otel_context.get_current()
        ctx = current.get_span_context()
        own = span.get_span_context()
        if ctx.is_valid and ctx.trace_id == own.trace_id:
            attrs = getattr(current, "attributes", None) or {}
            if attrs.get(sc.RUN_ID, self.run_id) != self.run_id:
                return trace.set_span_in_context(span)  # another run's span (a child run)
            parent = getattr(current, "parent", None)
            if current in self._open_nodes or (parent is not None and (
                    parent.span_id == own.span_id
                    or any(n.get_span_context().span_id == parent.span_id for n in list(self._open_nodes)))):
                return otel_context.get_current()
        return trace.set_span_in_context(span)

    def _node_opened(self, span: Any) -> None:
        if span is not None:
            self._open_nodes.add(span)

    def _node_closed(self, span: Any) -> None:
        self._open_nodes.discard(span)

    def _event(self, kind: EventType, step: int | None, turn_id: str | None, **fields: Any) -> AgentEvent:
        return AgentEvent(kind, self.run_id, self.session_id, turn_id if turn_id is not None else self.turn_id,
                          step, agent=self.agent, **fields)


class _NodeCall:
    """What a model call and a tool call share: the start event's span opens under the run's node parent and is
    current inside the block; on exit the end event is sent and the span closed. Capture's own failures are
    counted as ``api_errors``, never raised. Subclasses say which events (``_start_event``, ``_end_event``)."""

    run: Run
    step: int | None
    turn_id: str | None
    span: Any
    error: str | None
    _scope: _Scope
    _pair: str | None = None  # pairs a tool call without an id with its result

    def _start_event(self) -> AgentEvent:
        raise NotImplementedError

    def _end_event(self) -> AgentEvent:
        raise NotImplementedError

    def _open(self) -> None:
        try:
            self.span = self.run.listener.dispatch(self._start_event(), context=self.run._node_parent(),
                                                   pair=self._pair)
            self.run._node_opened(self.span)
            self._scope.enter(self.span)
        except Exception:
            self.run.listener.stats.incr("api_errors")

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None:
            self.error = _error_text(exc)
        try:
            self.run.listener.dispatch(self._end_event(), pair=self._pair)
        except Exception:
            self.run.listener.stats.incr("api_errors")
        self.run._node_closed(self.span)
        self._scope.exit()
        return False

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        return self.__exit__(exc_type, exc, tb)

    def score(self, name: str, value: float | None = None, label: str | None = None,
              explanation: str | None = None, *, source: str = "code", version: str | None = None,
              response_id: str | None = None, error_type: str | None = None) -> bool:
        """A ``gen_ai.evaluation.result`` event for this node (see ``Run.score``): on its span while it is
        open, on the run span after it closed, and in a tape of its own once the run has ended too."""
        attrs = self.run._score_attrs(name, value, label, explanation, source, version, response_id, error_type)
        return self.run._score(self.span, attrs) if attrs is not None else False


class ModelCall(_NodeCall):
    """``with run.model_call(model=..., messages=...) as call:`` then delta/reasoning/retry/finish."""

    def __init__(self, run: Run, model: str | None, messages: Any, *, provider: str | None, system: Any,
                 tools: Any, step: int | None, turn_id: str | None, attributes: Mapping[str, Any] | None,
                 params: Mapping[str, Any]) -> None:
        self.run = run
        self.model = model
        self.messages = messages
        self.provider = provider
        self.system = system
        self.tools = tools
        self.params = dict(params)
        self.step = step
        self.turn_id = turn_id
        self.attributes = attributes
        self.span: Any = None
        self.error: str | None = None
        self._texts: list[str] = []
        self._scope = _Scope()

    @property
    def text(self) -> str:
        """Text streamed or finished so far."""
        return "".join(self._texts)

    def _send(self, kind: EventType, **fields: Any) -> None:
        self.run.listener.dispatch(self.run._event(kind, self.step, self.turn_id, **fields))

    def __enter__(self) -> "ModelCall":
        if self.step is None:
            self.step = self.run.next_step()
        self._open()
        return self

    async def __aenter__(self) -> "ModelCall":
        return self.__enter__()

    def _start_event(self) -> AgentEvent:
        payload: dict[str, Any] = {"model": self.model, "messages": self.messages}
        if self.system is not None:
            payload["system"] = self.system
        if self.tools is not None:
            payload["tools"] = self.tools
        payload.update(self.params)
        return self.run._event(EventType.MODEL_REQUEST, self.step, self.turn_id, payload=payload,
                               model=self.model, provider=self.provider, attributes=self.attributes)

    def _end_event(self) -> AgentEvent:
        return self.run._event(EventType.STEP_END, self.step, self.turn_id, error=self.error)

    def delta(self, text: str, raw: Any = None) -> None:
        """One streamed chunk: text is concatenated, a non-empty raw chunk replaces the previous one."""
        if text:
            self._texts.append(text)
        self._send(EventType.MODEL_RESPONSE, text=text, payload=raw)

    def reasoning(self, text: str) -> None:
        self._send(EventType.MODEL_REASONING, text=text)

    def retry(self, reason: str | BaseException | None = None) -> None:
        text = _error_text(reason) if isinstance(reason, BaseException) else reason
        self._send(EventType.MODEL_RETRY, text=text)

    def metadata(self, **values: Any) -> None:
        self._send(EventType.METADATA, payload=values)

    def finish(self, raw: Any = None, *, text: str | None = None, usage: Any = None, tool_calls: Any = None,
               finish_reason: str | None = None, response_model: str | None = None,
               response_id: str | None = None) -> None:
        """The final response: raw provider payload (text, tool calls, usage are read from it when present)
        and/or explicit values that take precedence."""
        if text:
            self._texts.append(text)
        details = None
        if tool_calls is not None or finish_reason is not None or response_model is not None or response_id is not None:
            details = {"tool_calls": tool_calls, "finish_reason": finish_reason, "response_model": response_model,
                       "response_id": response_id}
            details = {k: v for k, v in details.items() if v is not None}
        self._send(EventType.MODEL_RESPONSE, text=text, payload=raw, usage=usage, details=details)



class ToolCall(_NodeCall):
    """``with run.tool_call("search", {"q": ...}, call_id=...) as tool: tool.result(value)``."""

    def __init__(self, run: Run, name: str, arguments: Any, *, call_id: str | None, step: int | None,
                 turn_id: str | None, attributes: Mapping[str, Any] | None) -> None:
        self.run = run
        self.name = name
        self.arguments = arguments
        self.call_id = call_id
        self.step = step
        self.turn_id = turn_id
        self.attributes = attributes
        self.span: Any = None
        self.value: Any = None
        self.error: str | None = None
        self._pair: str | None = None
        self._scope = _Scope()

    def result(self, value: Any) -> Any:
        """Record the tool's output; returns it so ``return tool.result(x)`` reads naturally."""
        self.value = value
        return value

    def __enter__(self) -> "ToolCall":
        if self.step is None:
            self.step = self.run.step
        if self.call_id is None:
            # Parallel calls of one tool without ids must still pair with their own results.
            self._pair = f"{self.name}#{next(self.run._unnamed)}"
        self._open()
        return self

    async def __aenter__(self) -> "ToolCall":
        return self.__enter__()

    def _start_event(self) -> AgentEvent:
        return self.run._event(EventType.TOOL_CALL, self.step, self.turn_id, payload=self.arguments,
                               tool_name=self.name, call_id=self.call_id, attributes=self.attributes)

    def _end_event(self) -> AgentEvent:
        return self.run._event(EventType.TOOL_RESULT, self.step, self.turn_id, payload=self.value,
                               tool_name=self.name, call_id=self.call_id, error=self.error)

