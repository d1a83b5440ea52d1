"""The OpenTelemetry SDK's span internals that the compiled modules read instead of its properties.

A ``ReadableSpan``'s properties return its fields (``_name``, ``_context``, ``_attributes``, ...;
``events`` and ``links`` copy a ``BoundedList`` under its lock, ``attributes`` wraps the holder in a
read-only view); a ``SpanContext`` is a tuple (trace id, span id, is_remote, flags, trace state); a
``Status`` keeps ``_status_code`` and ``_description``, a ``TraceState`` its pairs in ``_dict``,
``BoundedAttributes`` its items in ``_dict`` and ``BoundedList`` its items in the deque ``_dq``. The
leaf writer (``integrity/_leaf.pyx``) and the OTLP encoder (``codec/_otlp_encode.pyx``) read those
fields where they can: an ended span's lists no longer change, and a property call costs more than the
value it returns.

``probe()`` checks every one of those facts at once, on objects it builds with the SDK installed
here; ``LAYOUT`` is its answer, made at import. Where any check fails (another SDK version or
implementation), ``LAYOUT`` is None and the compiled modules read everything through properties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """The SDK types whose fields the compiled modules may read."""

    readable_span: type
    span_context: type
    trace_state: type
    event: type
    status: type
    bounded_attributes: type
    bounded_list: type


def probe() -> Layout | None:
    """The SDK's types, when its properties return the fields named above; None otherwise."""
    try:
        from opentelemetry.attributes import BoundedAttributes
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util import BoundedList
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
    except ImportError:
        return None
    try:
        ok = _holds(ReadableSpan, SpanContext, TraceState, Event, Status, BoundedAttributes, BoundedList,
                    SpanKind, StatusCode, TraceFlags)
    except Exception:  # noqa: BLE001 - a field that is not there: read through properties
        ok = False
    if not ok:
        return None
    return Layout(ReadableSpan, SpanContext, TraceState, Event, Status, BoundedAttributes, BoundedList)


def _holds(ReadableSpan: Any, SpanContext: Any, TraceState: Any, Event: Any, Status: Any,  # noqa: N803
           BoundedAttributes: Any, BoundedList: Any, SpanKind: Any, StatusCode: Any, TraceFlags: Any) -> bool:
    ts = TraceState([("k", "v")])
    ctx = SpanContext(7, 9, False, TraceFlags(1), ts)
    parent = SpanContext(7, 8, True, TraceFlags(1))
    attrs = BoundedAttributes(None, {"a": 1})
    attrs.dropped = 2
    ev_attrs = BoundedAttributes(None, {"b": 2})
    ev_attrs.dropped = 5
    ev = Event("e", ev_attrs, 6)
    events = BoundedList(None)
    events.append(ev)
    events.dropped = 3
    links = BoundedList(None)
    links.dropped = 4
    st = Status(StatusCode.ERROR, "why")
    span = ReadableSpan(name="probe", context=ctx, parent=parent, attributes=attrs, events=events, links=links,
                        kind=SpanKind.CLIENT, status=st, start_time=10, end_time=11)
    return bool(
        type(ctx) is SpanContext and type(parent) is SpanContext and isinstance(ctx, tuple)
        and ctx[0] == ctx.trace_id == 7 and ctx[1] == ctx.span_id == 9 and ctx[2] is ctx.is_remote is False
        and ctx[4] is ctx.trace_state is ts and parent[1] == parent.span_id == 8 and parent[2] is parent.is_remote
        and type(ts._dict) is dict and list(ts._dict.items()) == list(ts.items()) == [("k", "v")]
        and span._name is span.name and span._context is span.get_span_context() is span.context
        and span._parent is span.parent and span._kind is span.kind
        and span._start_time == span.start_time == 10 and span._end_time == span.end_time == 11
        and span._status is span.status and span._attributes is attrs and span._events is events
        and span._links is links and type(attrs._dict) is dict and dict(span.attributes) == attrs._dict
        and type(events._dq).__name__ == "deque" and tuple(events._dq) == span.events == (ev,)
        and type(links._dq).__name__ == "deque" and tuple(links._dq) == span.links == ()
        and (span.dropped_attributes, span.dropped_events, span.dropped_links) == (2, 3, 4)
        and (attrs.dropped, events.dropped, links.dropped) == (2, 3, 4)
        and ev._name is ev.name and ev._timestamp == ev.timestamp == 6 and ev._attributes is ev.attributes
        and ev.dropped_attributes == ev_attrs.dropped == 5
        and st._status_code is st.status_code and st._description is st.description
        and st.status_code._value_ == st.status_code.value
        and span.kind._value_ == span.kind.value
    )


LAYOUT = probe()
