"""Attributes of our own spans without the SDK re-validating every value.

The SDK's attribute setters check and copy each value (about 0.6 us an attribute), which is most of
what a node span costs beyond the OTLP encoding. Capture builds these values itself (str, bool, int,
float, tuples of str), so for an SDK span with no count or length limit in the way they go straight
into its attribute map, under the same locks the SDK takes. Anything else (another span class, a limit
that would cut or evict, an ended span, a value of another type) goes through the public API.

A node span may also start bare and get its attributes right after ``start_span`` returns, before any
code but the span processors has seen it, when nothing can tell the difference: the sampler is one of
the SDK's attribute-blind samplers and every processor on the provider is capture's own chain (which
reads no node attribute at start).
"""

from __future__ import annotations

from typing import Any

import opentelemetry.sdk.trace as sdk_trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, StaticSampler, TraceIdRatioBased

_SDK_SPAN = getattr(sdk_trace, "_Span", SdkSpan)  # the class tracers instantiate
_SCALARS = frozenset({str, bool, int, float})
_SCALARS_OR_TUPLE = _SCALARS | {tuple}

#: Set on capture's outermost span processor: marks a provider chain that reads no attribute at start.
CHAIN_MARK = "agenttape_chain"


def _all_valid(attributes: dict[str, Any]) -> bool:
    kinds = set(map(type, attributes.values()))
    if kinds <= _SCALARS:
        return True
    if not kinds <= _SCALARS_OR_TUPLE:
        return False
    for v in attributes.values():  # (loops: asked twice a node span, with a tuple of finish reasons)
        if type(v) is tuple:
            for x in v:
                if type(x) is not str:
                    return False
    return True


def set_valid_attributes(span: Any, attributes: dict[str, Any]) -> None:
    """``span.set_attributes(attributes)``, skipping the SDK's per-value checks when they cannot matter."""
    if type(span) is _SDK_SPAN or isinstance(span, SdkSpan):
        bounded = getattr(span, "_attributes", None)
        lock = getattr(span, "_lock", None)
        if (type(bounded) is BoundedAttributes and lock is not None and bounded.max_value_len is None
                and _all_valid(attributes)):
            with lock:
                if span._end_time is None and not bounded._immutable:  # noqa: SLF001
                    with bounded._lock:  # noqa: SLF001
                        items = bounded._dict  # noqa: SLF001
                        if bounded.maxlen is None or len(items) + len(attributes) <= bounded.maxlen:
                            if not items.keys().isdisjoint(attributes):
                                for key in attributes.keys() & items.keys():
                                    del items[key]  # the SDK's order: a re-set key moves to the end
                            items.update(attributes)
                            return
    span.set_attributes(attributes)


def _attribute_blind(sampler: Any, depth: int = 0) -> bool:
    kind = type(sampler)
    if kind is StaticSampler or kind is TraceIdRatioBased or kind.__name__ in ("_AlwaysOn", "_AlwaysOff"):
        return True
    if isinstance(sampler, ParentBased) and depth < 2:
        delegates = [v for v in vars(sampler).values() if isinstance(v, Sampler)]
        return bool(delegates) and all(_attribute_blind(d, depth + 1) for d in delegates)
    return False


class BareStart:
    """Answers, per tracer and cheaply, whether node spans may start bare (see the module doc)."""

    __slots__ = ("_tracer", "_seen", "_ok")

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._seen: Any = None
        self._ok = False

    def ok(self) -> bool:
        tracer = self._tracer
        if not isinstance(tracer, SdkTracer):
            return False
        processors = getattr(tracer.span_processor, "_span_processors", None)
        if processors is not self._seen:  # re-checked whenever a processor is added
            self._ok = (processors is not None and len(processors) > 0
                        and all(getattr(p, CHAIN_MARK, False) for p in processors)
                        and _attribute_blind(tracer.sampler))
            self._seen = processors
        return self._ok
