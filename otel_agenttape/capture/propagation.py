"""W3C trace context for child runs in other processes: inject on the way out, extract on the way in.

The carrier gets ``traceparent``/``tracestate`` (the run span) and ``baggage`` with the parent run and
session ids, through the globally configured propagator (``opentelemetry.propagate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, MutableMapping

from opentelemetry import baggage, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext

from otel_agenttape import semconv as sc


@dataclass(frozen=True)
class RemoteParent:
    """What a child process knows about the run that started it."""

    context: Context
    span_context: SpanContext | None
    run_id: str | None
    session_id: str | None


def inject_context(carrier: MutableMapping[str, str] | None = None, *, run: Any = None,
                   context: Context | None = None) -> MutableMapping[str, str]:
    """Write the current (or ``run``'s) trace context and run ids into ``carrier`` (HTTP headers, env)."""
    carrier = {} if carrier is None else carrier
    ctx = context
    if run is not None:
        ctx = trace.set_span_in_context(run.span, ctx) if getattr(run, "span", None) is not None else ctx
        ctx = baggage.set_baggage(sc.RUN_ID, run.run_id, ctx)
        if run.session_id:
            ctx = baggage.set_baggage(sc.SESSION_ID, run.session_id, ctx)
    propagate.inject(carrier, context=ctx)
    return carrier


def extract_context(carrier: Any) -> RemoteParent:
    """Read what ``inject_context`` wrote (header names are matched case-insensitively)."""
    if isinstance(carrier, RemoteParent):
        return carrier
    lowered = {str(k).lower(): v for k, v in dict(carrier or {}).items()}
    ctx = propagate.extract(lowered)
    span_ctx = trace.get_current_span(ctx).get_span_context()
    run_id = baggage.get_baggage(sc.RUN_ID, ctx)
    session_id = baggage.get_baggage(sc.SESSION_ID, ctx)
    return RemoteParent(ctx, span_ctx if span_ctx.is_valid else None,
                        str(run_id) if run_id is not None else None,
                        str(session_id) if session_id is not None else None)
