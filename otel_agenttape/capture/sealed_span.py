"""The span the sealing processor forwards: a copy of the ended span with other attributes.

``SealedSpan`` is a shallow copy of an SDK ``ReadableSpan`` that carries the ``agenttape.chain.*``
attributes (the SDK's ``on_end`` span is read-only). ``make_otlp_safe`` is the copy of a span whose
values OTLP cannot carry (see ``codec.typed.otlp_safe``), with the coerced keys listed in
``agenttape.integrity.coerced``. The compiled sealing step (``_sealing.pyx``) builds a ``SealedSpan``
the way ``SealedSpan.__init__`` does, from the field names below (``sealing_fast.configure`` passes them).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace.status import Status

from otel_agenttape import semconv
from otel_agenttape.codec.typed import clean_text, otlp_safe_attributes

# The instance fields a SealedSpan sets over its copy of the span's __dict__: the original span (for
# its dropped counts) and the SDK's own ``ReadableSpan._attributes``, which ``attributes`` reads.
ORIGINAL_FIELD = "_original"
ATTRIBUTES_FIELD = "_attributes"


class SealedSpan(ReadableSpan):
    """A copy of an ended span with other attributes (and events), keeping its dropped counts."""

    def __init__(self, span: ReadableSpan, attributes: dict[str, Any], events: tuple | None = None) -> None:
        d = span.__dict__.copy()  # one shallow copy; the dropped counts are read from the original
        d[ORIGINAL_FIELD] = span
        d[ATTRIBUTES_FIELD] = attributes
        if events is not None:
            d["_events"] = events
        self.__dict__ = d

    @property
    def dropped_attributes(self) -> int:
        return self._original.dropped_attributes

    @property
    def dropped_events(self) -> int:
        return self._original.dropped_events

    @property
    def dropped_links(self) -> int:
        return self._original.dropped_links


def make_otlp_safe(span: ReadableSpan) -> SealedSpan:
    """A copy of ``span`` holding only what OTLP can carry (see ``codec.typed.otlp_safe``), coerced keys listed."""
    attrs, coerced = otlp_safe_attributes(span.attributes)
    events = []
    for i, ev in enumerate(span.events):
        ev_attrs, ev_coerced = otlp_safe_attributes(ev.attributes)
        name = clean_text(ev.name)
        if ev_coerced or name != ev.name:
            coerced.extend(f"event:{i}:{k}" for k in ev_coerced or ["name"])
            events.append(Event(name, _bounded(ev_attrs, ev.dropped_attributes), ev.timestamp))
        else:
            events.append(ev)
    links = []
    for i, lk in enumerate(span.links):
        lk_attrs, lk_coerced = otlp_safe_attributes(lk.attributes)
        if lk_coerced:
            coerced.extend(f"link:{i}:{k}" for k in lk_coerced)
            links.append(trace_api.Link(lk.context, _bounded(lk_attrs, lk.dropped_attributes)))
        else:
            links.append(lk)
    name = clean_text(span.name)
    if name != span.name:
        coerced.append("name")
    status = span.status
    if status.description and clean_text(status.description) != status.description:
        coerced.append("status")
        status = Status(status.status_code, clean_text(status.description))
    if coerced:
        attrs[semconv.INTEGRITY_COERCED] = tuple(coerced)
    copy = SealedSpan(span, attrs, tuple(events))
    copy._name = name
    copy._status = status
    copy._links = tuple(links)
    return copy


def _bounded(attrs: dict[str, Any], dropped: int) -> BoundedAttributes:
    bounded = BoundedAttributes(maxlen=None, attributes=attrs, immutable=True)
    bounded.dropped = dropped
    return bounded
