"""One model call, one span: a provider SDK call made inside a framework's recorded model call is not
recorded again.

A LangChain ``ChatOpenAI`` call is recorded by the LangChain instrumentation (OpenInference's or
OpenLLMetry's: an LLM span with the prompt, answer and tokens) and, underneath, by the OpenAI SDK's
instrumentation (a chat span with the same prompt and answer). OpenInference does not make its spans
current, so the SDK's span even lands in a trace of its own: each model call would be two model nodes
and an extra run. Not enabling the SDK instrumentation is no answer, because the same app may also call
the SDK directly, and those calls have no other record.

So the provider SDK instrumentations (``PROVIDER_LIBRARIES``) get a tracer provider whose tracers start
a non-recording span while the current context is inside a framework model call; everywhere else they
record as usual. LangChain: a callback handler registered with ``langchain_core``'s configure hook marks
the context from ``on_chat_model_start``/``on_llm_start`` to ``on_llm_end``/``on_llm_error`` (run inline,
so the mark is in the context that then calls the SDK). A run that never ends stops counting once
LangChain forgets it (the mark names live runs only).

The OpenAI Agents SDK: its models call the OpenAI SDK inside a generation (chat completions) or
response (Responses API) span of the SDK's own tracing, which is current while the call runs. A tracing
processor that records those spans as OTel spans (our ``AgentTapeProcessor``; the ``agents_marker``
added beside an Agents SDK instrumentation) names each such span live from its start to its end;
inside a live one the provider SDK's span is skipped. A processor the app removed
(``set_trace_processors``) marks nothing, so the SDK span is recorded again, as it must be: nothing
else records the call then.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Any, Iterator, Sequence
from uuid import UUID

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.util._decorator import _agnosticcontextmanager

# Entry point names of instrumentations of a model provider's SDK (the lowest layer a model call goes
# through), and of frameworks whose instrumentation records each model call itself.
PROVIDER_LIBRARIES = frozenset({
    "openai", "anthropic", "google_genai", "google-genai", "vertexai", "bedrock", "groq", "mistralai", "cohere",
    "ollama",
})
FRAMEWORK_LIBRARIES = frozenset({"langchain", "langgraph", "openai_agents"})
AGENTS_DISTRIBUTION = "openai-agents"  # our AgentTapeProcessor may be added by the app at any time
AGENTS_MODEL_SPANS = frozenset({"generation", "response"})

_MARK: ContextVar[tuple[UUID, ...]] = ContextVar("agenttape_framework_model_call", default=())
_LIVE: set[UUID] = set()
_LIVE_LOCK = threading.Lock()
_HOOKED = False
_AGENT_CALLS: set[str] = set()  # Agents SDK span ids of live model calls a processor records
_agents_current: Any = None  # agents.tracing.get_current_span, once a call was marked
_AGENTS_HOOKED = False
suppressed = 0  # SDK spans not recorded because a framework recorded the call (for debugging)


def in_framework_call() -> bool:
    """Whether the current context is inside a model call a framework instrumentation records."""
    marks = _MARK.get()
    if marks:
        with _LIVE_LOCK:
            if any(m in _LIVE for m in marks):
                return True
    if _AGENT_CALLS and _agents_current is not None:
        try:
            current = _agents_current()
        except Exception:
            return False
        return current is not None and getattr(current, "span_id", None) in _AGENT_CALLS
    return False


def frameworks(libraries: Sequence[str]) -> list[str]:
    """The frameworks among these enabled libraries whose instrumentation records model calls, and
    the OpenAI Agents SDK when it is installed (the app may add our processor to it)."""
    found = set(libraries) & FRAMEWORK_LIBRARIES
    if "openai_agents" not in found and _installed(AGENTS_DISTRIBUTION):
        found.add("openai_agents")
    return sorted(found)


def overlapping(libraries: Sequence[str]) -> bool:
    """Whether these enabled libraries would record some model calls twice (a framework and an SDK)."""
    return bool(set(libraries) & PROVIDER_LIBRARIES) and bool(frameworks(libraries))


def _installed(distribution: str) -> bool:
    from importlib.metadata import PackageNotFoundError, distribution as find

    try:
        find(distribution)
        return True
    except PackageNotFoundError:
        return False
    except Exception:
        return False


# ---- LangChain: mark the context of each model run ------------------------------------------------------

def hook_langchain() -> bool:
    """Mark LangChain model runs (once a process). False when langchain_core is not importable."""
    global _HOOKED
    if _HOOKED:
        return True
    try:
        from langchain_core.callbacks import BaseCallbackHandler
        from langchain_core.tracers.context import register_configure_hook
    except Exception:
        return False

    class ModelCallMark(BaseCallbackHandler):
        """Marks the context between a model run's start and end (never raises into the app)."""

        run_inline = True
        raise_error = False

        def _start(self, run_id: UUID) -> None:
            with _LIVE_LOCK:
                _LIVE.add(run_id)
            _MARK.set(_MARK.get() + (run_id,))

        def _end(self, run_id: UUID) -> None:
            with _LIVE_LOCK:
                _LIVE.discard(run_id)
            marks = _MARK.get()
            if run_id in marks:
                _MARK.set(tuple(m for m in marks if m != run_id))

        def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any) -> None:
            self._start(run_id)

        def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: UUID, **kwargs: Any) -> None:
            self._start(run_id)

        def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
            self._end(run_id)

        def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
            self._end(run_id)

    # a variable whose value in every context (threads included) is the one handler: langchain_core
    # adds it to every callback manager it configures
    var: ContextVar[Any] = ContextVar("agenttape_langchain_model_calls", default=ModelCallMark())
    register_configure_hook(var, inheritable=True)
    _HOOKED = True
    return True


# ---- the OpenAI Agents SDK: mark its live model call spans -------------------------------------------------

def agents_call_started(span: Any) -> None:
    """An Agents SDK span started; a generation or response span is a model call recorded by the
    processor that calls this (never raises)."""
    global _agents_current
    try:
        if span.span_data.type not in AGENTS_MODEL_SPANS:
            return
        if _agents_current is None:
            from agents.tracing import get_current_span

            _agents_current = get_current_span
        with _LIVE_LOCK:
            _AGENT_CALLS.add(span.span_id)
    except Exception:
        pass


def agents_call_ended(span: Any) -> None:
    """An Agents SDK span ended (never raises)."""
    try:
        if _AGENT_CALLS:
            with _LIVE_LOCK:
                _AGENT_CALLS.discard(span.span_id)
    except Exception:
        pass


def hook_openai_agents() -> bool:
    """Beside an Agents SDK instrumentation (another package's tracing processor), a processor that
    marks the model calls it records (once a process). False when the SDK is not importable."""
    global _AGENTS_HOOKED
    if _AGENTS_HOOKED:
        return True
    try:
        from agents import add_trace_processor
        from agents.tracing import TracingProcessor
    except Exception:
        return False

    class AgentsModelCallMark(TracingProcessor):
        """Marks the Agents SDK's model call spans live while they run (records nothing itself)."""

        def on_trace_start(self, trace_obj: Any) -> None:
            return None

        def on_trace_end(self, trace_obj: Any) -> None:
            return None

        def on_span_start(self, span: Any) -> None:
            agents_call_started(span)

        def on_span_end(self, span: Any) -> None:
            agents_call_ended(span)

        def shutdown(self) -> None:
            return None

        def force_flush(self) -> None:
            return None

    add_trace_processor(AgentsModelCallMark())
    _AGENTS_HOOKED = True
    return True


# ---- the provider SDK instrumentations' tracer provider ------------------------------------------------

class _Tracer(trace.Tracer):
    """Delegates to the real tracer, except inside a framework model call."""

    def __init__(self, inner: trace.Tracer) -> None:
        self._inner = inner

    @staticmethod
    def _skip(context: Context | None) -> trace.Span | None:
        if not in_framework_call():
            return None
        global suppressed
        suppressed += 1
        return trace.NonRecordingSpan(trace.get_current_span(context).get_span_context())

    def start_span(self, name: str, context: Context | None = None, *args: Any, **kwargs: Any) -> trace.Span:
        return self._skip(context) or self._inner.start_span(name, context, *args, **kwargs)

    @_agnosticcontextmanager  # the decorator the API's Tracer uses (a context manager and a decorator)
    def start_as_current_span(self, name: str, context: Context | None = None, *args: Any,
                              **kwargs: Any) -> Iterator[trace.Span]:
        skip = self._skip(context)
        if skip is not None:
            with trace.use_span(skip, end_on_exit=False) as span:
                yield span
            return
        with self._inner.start_as_current_span(name, context, *args, **kwargs) as span:
            yield span


class DedupTracerProvider(trace.TracerProvider):
    """The tracer provider handed to provider SDK instrumentations when a framework records calls too."""

    def __init__(self, inner: trace.TracerProvider) -> None:
        self._inner = inner

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _Tracer(self._inner.get_tracer(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:  # resource, span processors, force_flush... of the real one
        return getattr(self._inner, name)
