"""The span processor chain: redact foreign content -> seal -> queue -> export, nothing raised.

``build_processor_chain`` is the single place that decides the order, so the sealing processor
(``otel_agenttape.capture.sealing.SealingSpanProcessor``) is connected here and nowhere else.

Why the chain ends in our export queue (``export_queue.QueueingSpanProcessor``) and not the SDK's
``BatchSpanProcessor``: not for speed, for what a full queue does. Measured with the same chain and
exporter, the sealed capture span of ``bench/capture_overhead.py``, the SDK processor swapped in
(2026-12-02, 2-core machine under load):
- a burst of 20,001 capture spans (plus 79 checkpoints) to a receiver that takes 0.2 s a request: the
  SDK's processor with its default 2,048-span queue delivered 15,918 of 20,080 and dropped the other
  4,162 (21 %) with a log line and nothing in ``tape.stats()``, spans that the tape's checkpoints
  cover (with an 8,192-span queue like ours it kept up in this burst, but drops the same way, uncounted,
  once that fills). Ours delivered all 20,080: a full queue makes the
  producer wait (at most ``enqueue_timeout_millis`` in all until the backend catches up), spills to
  the outbox when there is one, and counts every span it cannot deliver.
- CPU a span, 7 interleaved rounds of 2,000: the same within the noise (medians 229 us ours, 243 us
  the SDK's at load 5.8; 282 against 250 at load 12-16), and a 5,000-span burst to a fast receiver
  lost nothing either way. So a wrapper would gain no speed and lose the behaviour above.
The SDK processor offers no hook for any of it (its queue is a private ``deque`` that drops the
oldest span on append), so wrapping it would still mean re-implementing the worker.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from otel_agenttape import semconv as sc
from otel_agenttape.capture.redact import REDACT_KEYS, REDACT_PREFIXES, redact_value
from otel_agenttape.capture.export_queue import (  # noqa: F401 - re-exported
    DEFAULT_ENQUEUE_TIMEOUT_MILLIS,
    DEFAULT_MAX_EXPORT_BATCH_SIZE,
    DEFAULT_MAX_QUEUE_SIZE,
    DEFAULT_SCHEDULE_DELAY_MILLIS,
    DEFAULT_SHUTDOWN_TIMEOUT_MILLIS,
    STOP_GRACE_SECONDS,
    QueueingSpanProcessor,
)
from otel_agenttape.capture.redact import Redactor
from otel_agenttape.capture.stats import CaptureStats

log = logging.getLogger(__name__)

# Content attributes of other instrumentations (GenAI, OpenInference, OpenLLMetry) that redaction covers.
CONTENT_KEYS, CONTENT_PREFIXES = REDACT_KEYS, REDACT_PREFIXES


def _inherits_noop(processor: SpanProcessor, name: str) -> bool:
    """Whether ``processor.<name>`` is SpanProcessor's own empty method (not overridden)."""
    return getattr(type(processor), name, None) is getattr(SpanProcessor, name, object())


class ForwardingSpanProcessor(SpanProcessor):
    """Base for processors that wrap the next one and forward every call."""

    def __init__(self, next_processor: SpanProcessor) -> None:
        self.next_processor = next_processor
        # Calls the next processor does nothing with are not forwarded (two calls fewer per span).
        self._passive_start = _inherits_noop(next_processor, "on_start")
        self._passive_ending = _inherits_noop(next_processor, "_on_ending")

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if not self._passive_start:
            self.next_processor.on_start(span, parent_context=parent_context)

    def _on_ending(self, span: Any) -> None:
        if self._passive_ending:
            return
        hook = getattr(self.next_processor, "_on_ending", None)
        if hook is not None:
            hook(span)

    def on_end(self, span: ReadableSpan) -> None:
        self.next_processor.on_end(span)

    def shutdown(self) -> None:
        self.next_processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.next_processor.force_flush(timeout_millis)


class GuardedSpanProcessor(ForwardingSpanProcessor):
    """Outermost wrapper: an exception anywhere in the chain is counted, never raised into the agent."""

    agenttape_chain = True  # fastspan.CHAIN_MARK: reads no node attribute at span start

    def __init__(self, next_processor: SpanProcessor, stats: CaptureStats,
                 queue: "QueueingSpanProcessor | None" = None) -> None:
        super().__init__(next_processor)
        self.stats = stats
        self.queue = queue

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self._passive_start:
            return
        try:
            self.next_processor.on_start(span, parent_context=parent_context)
        except Exception:
            self.stats.incr("processor_errors")

    def _on_ending(self, span: Any) -> None:
        if self._passive_ending:
            return
        try:
            super()._on_ending(span)
        except Exception:
            self.stats.incr("processor_errors")

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self.next_processor.on_end(span)
        except Exception:
            self.stats.incr("processor_errors")

    def shutdown(self) -> None:
        try:
            if self.queue is not None:  # one bound for all of it: the final checkpoints do not wait
                self.queue.begin_shutdown()
            self.next_processor.shutdown()
        except Exception:
            self.stats.incr("processor_errors")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return self.next_processor.force_flush(timeout_millis)
        except Exception:
            self.stats.incr("processor_errors")
            return False


class SealGuard(ForwardingSpanProcessor):
    """Runs the sealing processor; if sealing fails on a span, the span still goes out unsealed
    (counted in ``sealing_errors``) rather than being lost."""

    def __init__(self, sealing: SpanProcessor, export: SpanProcessor, stats: CaptureStats) -> None:
        super().__init__(sealing)
        self.export = export
        self.stats = stats

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        try:
            self.next_processor.on_start(span, parent_context=parent_context)
        except Exception:
            self.stats.incr("sealing_errors")

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self.next_processor.on_end(span)
        except Exception:
            self.stats.incr("sealing_errors")
            self.export.on_end(span)


class RedactingSpanProcessor(ForwardingSpanProcessor):
    """Redacts content attributes of spans from other instrumentations (ours are redacted at the
    source) and forwards a copy, so sealing and export only ever see redacted content."""

    def __init__(self, next_processor: SpanProcessor, redactor: Redactor) -> None:
        super().__init__(next_processor)
        self.redactor = redactor

    def on_end(self, span: ReadableSpan) -> None:
        scope = span.instrumentation_scope
        if scope is not None and scope.name == sc.SCOPE_NAME:
            self.next_processor.on_end(span)
            return
        attrs = span.attributes or {}
        changed: dict[str, Any] = {}
        for key, value in attrs.items():
            if key in CONTENT_KEYS or key.startswith(CONTENT_PREFIXES):
                new = redact_value(value, self.redactor)
                if new is not value and new != value:
                    changed[key] = new
        if not changed:
            self.next_processor.on_end(span)
            return
        self.next_processor.on_end(copy_span(span, {**attrs, **changed}))


def copy_span(span: ReadableSpan, attributes: Mapping[str, Any]) -> ReadableSpan:
    """A ReadableSpan identical to ``span`` but with other attributes."""
    return ReadableSpan(
        name=span.name, context=span.context, parent=span.parent, resource=span.resource,
        attributes=dict(attributes), events=span.events, links=span.links, kind=span.kind,
        status=span.status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


SEALING_MODULE = "otel_agenttape.capture.sealing"


def _load_sealing() -> type | None:
    import importlib

    return getattr(importlib.import_module(SEALING_MODULE), "SealingSpanProcessor", None)


def _check_seal_options(sealing_cls: type, options: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` for a keyword the sealing processor does not take (as ``queue_options`` does)."""
    try:
        sig = inspect.signature(sealing_cls)
    except (TypeError, ValueError):  # no signature to check against: the constructor will say
        return
    try:
        sig.bind(None, **dict(options))
    except TypeError as exc:
        raise TypeError(f"seal_options: {exc}") from None


def _takes(cls: type, name: str) -> bool:
    """Whether ``cls`` takes the keyword ``name`` by that name (a sealer of another version may not)."""
    try:
        return name in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def _sealing_counts(sealer: Any) -> dict[str, int]:
    """The sealing processor's own counters (it swallows its errors and forwards unsealed)."""
    out = {}
    for attr, name in (("errors", "sealing_errors"), ("sealed", "spans_sealed"), ("checkpoints", "checkpoints")):
        value = getattr(sealer, attr, None)
        if isinstance(value, int):
            out[name] = value
    return out


def build_processor_chain(
    exporter: SpanExporter,
    *,
    stats: CaptureStats,
    seal: bool = True,
    seal_options: Mapping[str, Any] | None = None,
    redactor: Redactor | None = None,
    queue_options: Mapping[str, Any] | None = None,
    outbox: Any = None,
    log_leaves: Any = None,
) -> tuple[SpanProcessor, QueueingSpanProcessor]:
    """Guard( Redact( SealGuard( Sealing( Queue(exporter) ) ) ) ); returns (chain, queue).

    Redaction comes before sealing so the chain covers exactly what leaves the process. When the
    sealing module is not available the chain runs unsealed and ``sealing_unavailable`` is set.
    ``log_leaves`` (``log_sealing.LogLeaves``): the log records sealed into live spans, handed to the sealer.
    """
    sealing_cls = None
    if seal:
        try:
            sealing_cls = _load_sealing()
        except Exception:
            sealing_cls = None
        if sealing_cls is not None:
            _check_seal_options(sealing_cls, seal_options or {})  # a typo is the caller's bug: raise now
    queue = QueueingSpanProcessor(exporter, stats=stats, outbox=outbox, **dict(queue_options or {}))
    stats.add_source(queue.stats_source)
    if outbox is not None:
        stats.add_source(lambda: queue.outbox.counts() if queue.outbox is not None else {})
        outbox.start()
    partial = getattr(exporter, "partial_success", None)
    if partial is not None and callable(getattr(partial, "counts", None)):
        stats.add_source(partial.counts)
    head: SpanProcessor = queue
    stats.set("sealing_active", 0)
    if seal:
        if sealing_cls is None:
            stats.set("sealing_unavailable", 1)
        else:
            try:
                options = dict(seal_options or {})
                if log_leaves is not None and _takes(sealing_cls, "log_leaves"):
                    options.setdefault("log_leaves", log_leaves)
                sealer = sealing_cls(queue, **options)
                head = SealGuard(sealer, queue, stats)
                stats.set("sealing_active", 1)
                stats.add_source(lambda: _sealing_counts(sealer))
            except Exception as exc:  # e.g. an unreadable AGENTTAPE_SIGNING_KEY: record unsealed, but say so
                log.warning("agenttape: sealing is off for this process, spans are exported unsealed: %s: %s",
                            type(exc).__name__, exc)
                stats.incr("sealing_errors")
                stats.set("sealing_unavailable", 1)
    if redactor is not None:
        head = RedactingSpanProcessor(head, redactor)
    return GuardedSpanProcessor(head, stats, queue), queue
