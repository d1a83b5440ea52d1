"""What every framework adapter needs: framework timestamps as nanoseconds, JSON text read back,
and a guard that keeps an adapter's own failure out of the agent."""

from __future__ import annotations

import functools
import json
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

F = TypeVar("F", bound=Callable[..., Any])
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def iso_ns(value: str | None) -> int | None:
    """An ISO 8601 time (as the Agents SDK stamps spans) in nanoseconds since the epoch."""
    if not value:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def parse_json(value: Any) -> Any:
    """Tool arguments arrive as JSON text: give the value, or the text when it is not JSON."""
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def guarded(method: F) -> F:
    """A framework callback must never raise into the framework: count the failure and go on."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception:
            self._stats.incr("listener_errors")
            return None

    return wrapper  # type: ignore[return-value]


def mark_replayed() -> None:
    """The current span (an adapter's tool span) got its result from the resume journal."""
    from otel_agenttape import semconv as sc

    span = trace.get_current_span()
    if span.get_span_context().is_valid:
        span.set_attribute(sc.RESUME_REPLAYED, True)


class Attached:
    """Makes a span current between a framework's start and end callbacks, so spans of other
    instrumentations inside (an HTTP client, an MCP client) nest under it. Detaches only in the
    context it attached in: a framework that ends a span elsewhere leaves that context untouched."""

    __slots__ = ("span", "token")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.token = otel_context.attach(trace.set_span_in_context(span)) if span is not None else None

    def release(self) -> None:
        if self.token is None:
            return
        if trace.get_current_span() is self.span:
            try:
                otel_context.detach(self.token)
            except Exception:
                pass
        self.token = None
