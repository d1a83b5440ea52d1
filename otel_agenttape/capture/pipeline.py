"""The span processor chain: redact foreign content -> seal -> queue -> export, nothing raised.

``build_processor_chain`` is the single place that decides the order, so the sealing processor
(``otel_agenttape.capture.sealing.SealingSpanProcessor``) is connected here and nowhere else.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_agenttape import semconv as sc
from otel_agenttape.capture.listener import SCOPE_NAME
from otel_agenttape.capture.redact import Redactor
from otel_agenttape.capture.stats import CaptureStats

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE_SIZE = 8192
DEFAULT_MAX_EXPORT_BATCH_SIZE = 512
DEFAULT_SCHEDULE_DELAY_MILLIS = 200
DEFAULT_ENQUEUE_TIMEOUT_MILLIS = 5000
DEFAULT_SHUTDOWN_TIMEOUT_MILLIS = 30000  # in total, like the SDK's BatchSpanProcessor
# The last part of the shutdown budget: the exporter is shut down (ending its retry sleeps) and the
# batch in flight gets this long to come back before it is counted as dropped.
STOP_GRACE_SECONDS = 0.5
_EXPORT_COUNTERS = ("spans_exported", "spans_export_failed", "export_batches", "export_failures",
                    "exporter_exceptions", "dropped_attributes", "dropped_events", "dropped_links")

# Content attributes of other instrumentations (GenAI, OpenInference, OpenLLMetry) that redaction covers.
CONTENT_KEYS = frozenset({
    sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES, sc.GEN_AI_SYSTEM_INSTRUCTIONS,
    sc.GEN_AI_TOOL_CALL_ARGUMENTS, sc.GEN_AI_TOOL_CALL_RESULT, sc.MODEL_RAW_OUTPUT, sc.MODEL_OUTPUT_TEXT,
    sc.MODEL_REASONING, sc.TOOL_ERROR, sc.OI_INPUT_VALUE, sc.OI_OUTPUT_VALUE,
    sc.TRACELOOP_ENTITY_INPUT, sc.TRACELOOP_ENTITY_OUTPUT,
})
CONTENT_PREFIXES = (sc.LEGACY_PROMPT_PREFIX, sc.LEGACY_COMPLETION_PREFIX, sc.OI_LLM_INPUT_MESSAGES,
                    sc.OI_LLM_OUTPUT_MESSAGES)


class _FlushWaiter:
    """A force_flush caller waiting for the spans queued before its call (sequence numbers < target)."""

    __slots__ = ("target", "ok", "done")

    def __init__(self, target: int) -> None:
        self.target = target
        self.ok = True
        self.done = threading.Event()


class QueueingSpanProcessor(SpanProcessor):
    """Batching export with a bounded queue that blocks (with a timeout) instead of dropping.

    The SDK's BatchSpanProcessor drops the oldest span when its 2048-slot queue is full, which loses
    about 29% of a 5,000-span burst. Here a full queue makes the producer wait up to
    ``enqueue_timeout_millis`` for the worker to make room, but only while the exporter is healthy: once
    an export fails, a full queue drops (counted) rather than stall the agent behind a dead backend.

    Only the worker thread calls ``exporter.export``; ``force_flush`` and ``shutdown`` wait for it with a
    deadline, so neither can be held up by a slow or dead backend for longer than its timeout.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        stats: CaptureStats | None = None,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
        max_export_batch_size: int = DEFAULT_MAX_EXPORT_BATCH_SIZE,
        schedule_delay_millis: float = DEFAULT_SCHEDULE_DELAY_MILLIS,
        enqueue_timeout_millis: float = DEFAULT_ENQUEUE_TIMEOUT_MILLIS,
        shutdown_timeout_millis: float = DEFAULT_SHUTDOWN_TIMEOUT_MILLIS,
    ) -> None:
        if max_queue_size <= 0 or max_export_batch_size <= 0 or schedule_delay_millis <= 0:
            raise ValueError("queue size, batch size and schedule delay must be positive")
        if shutdown_timeout_millis < 0:
            raise ValueError("shutdown_timeout_millis must not be negative")
        self.exporter = exporter
        self.stats = stats or CaptureStats()
        self.max_queue_size = max_queue_size
        self.max_export_batch_size = min(max_export_batch_size, max_queue_size)
        self._delay = schedule_delay_millis / 1000.0
        self._enqueue_timeout = enqueue_timeout_millis / 1000.0
        self._shutdown_timeout = shutdown_timeout_millis / 1000.0
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._space = threading.Event()
        self._shutdown = False
        self._healthy = True
        self._queued = itertools.count()
        self._blocked = itertools.count()
        self._dropped_full = itertools.count()
        self._dropped_shutdown = itertools.count()
        self._counts = collections.Counter(dict.fromkeys(_EXPORT_COUNTERS, 0))
        self._reset_export_state()
        self.stats_source = self._stats
        self._start_worker()
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (ref() or (lambda: None))())

    def _reset_export_state(self) -> None:
        # Guards the batch in flight, the flush waiters and every count shutdown may add to.
        self._lock = threading.Lock()
        self._taken = 0          # spans taken off the queue so far (their sequence numbers are < _taken)
        self._inflight: list[ReadableSpan] | None = None
        self._waiters: list[_FlushWaiter] = []
        self._export_deadline = float("inf")
        self._exporter_stopped = False
        self._left_behind = 0    # queued or in-flight spans that shutdown gave up on

    def _start_worker(self) -> None:
        self._pid = os.getpid()
        self._worker = threading.Thread(target=self._run, name="AgentTapeExport", daemon=True)
        self._worker.start()

    def _after_fork(self) -> None:
        # The child inherits the parent's queued spans but not its worker thread.
        self._queue.clear()
        self._reset_export_state()
        self._wake = threading.Event()
        self._space = threading.Event()
        self._start_worker()

    # ---- producer side (on_start and _on_ending are SpanProcessor's no-ops) ------------------
    def on_end(self, span: ReadableSpan) -> None:
        if self._shutdown:
            next(self._dropped_shutdown)
            return
        queue = self._queue
        if len(queue) >= self.max_queue_size and not self._wait_for_space():
            next(self._dropped_full)
            return
        queue.append(span)
        next(self._queued)
        if len(queue) >= self.max_export_batch_size and not self._wake.is_set():
            self._wake.set()

    def _wait_for_space(self) -> bool:
        if not self._healthy or threading.current_thread() is self._worker:
            return False
        next(self._blocked)
        deadline = time.monotonic() + self._enqueue_timeout
        self._wake.set()
        while len(self._queue) >= self.max_queue_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._shutdown:
                return False
            self._space.clear()
            if len(self._queue) < self.max_queue_size:
                break
            self._space.wait(min(remaining, 0.05))
        return True

    # ---- worker side -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._shutdown:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._drain()
        self._drain()

    def _drain(self) -> None:
        queue = self._queue
        while True:
            with self._lock:
                if not queue:
                    return
                if self._shutdown and not self._may_export_locked():
                    self._leave_behind_locked()
                    return
                count = min(self.max_export_batch_size, len(queue))
                batch = [queue.popleft() for _ in range(count)]
                self._taken += count
                self._inflight = batch
            self._space.set()
            ok = self._export(batch)
            with self._lock:
                if self._inflight is not batch:  # shutdown gave up on it and counted it
                    return
                self._inflight = None
                self._settle_locked(count, ok)

    def _may_export_locked(self) -> bool:
        """During shutdown: export only while the exporter works and the deadline is ahead."""
        return self._healthy and not self._exporter_stopped and time.monotonic() < self._export_deadline

    def _export(self, batch: list[ReadableSpan]) -> bool:
        counts = self._counts
        for span in batch:
            try:
                counts["dropped_attributes"] += span.dropped_attributes
                counts["dropped_events"] += span.dropped_events
                counts["dropped_links"] += span.dropped_links
            except Exception:
                pass
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            return self.exporter.export(batch) is SpanExportResult.SUCCESS
        except Exception:
            with self._lock:
                counts["exporter_exceptions"] += 1
            return False
        finally:
            detach(token)

    def _settle_locked(self, count: int, ok: bool) -> None:
        counts = self._counts
        counts["export_batches"] += 1
        if ok:
            counts["spans_exported"] += count
        else:
            counts["export_failures"] += 1
            counts["spans_export_failed"] += count
        self._healthy = ok
        self._notify_locked(self._taken - count, self._taken, ok)

    def _notify_locked(self, start: int, end: int, ok: bool) -> None:
        """Spans [start, end) are settled: release the flush callers waiting for them."""
        waiting = []
        for waiter in self._waiters:
            if start < waiter.target:
                waiter.ok = waiter.ok and ok
                if end >= waiter.target:
                    waiter.done.set()
                    continue
            waiting.append(waiter)
        self._waiters = waiting

    def _leave_behind_locked(self) -> None:
        """Shutdown stops exporting: count what is queued or in flight as dropped and settle it."""
        inflight = self._inflight
        start = self._taken - (len(inflight) if inflight is not None else 0)
        count = len(inflight) if inflight is not None else 0
        self._inflight = None
        queue = self._queue
        while True:  # popleft, not clear(): a span appended meanwhile is either counted or stays queued
            try:
                queue.popleft()
            except IndexError:
                break
            count += 1
            self._taken += 1
        if count:
            self._left_behind += count
            self._notify_locked(start, self._taken, False)
        self._space.set()

    def _stats(self) -> dict[str, int]:
        out = dict(self._counts)
        out["spans_queued"] = _peek(self._queued)
        out["enqueue_blocked"] = _peek(self._blocked)
        out["spans_dropped_queue_full"] = _peek(self._dropped_full)
        out["spans_dropped_shutdown"] = _peek(self._dropped_shutdown) + self._left_behind
        out["queue_length"] = len(self._queue)
        return out

    # ---- lifecycle -------------------------------------------------------------------------
    def force_flush(self, timeout_millis: int | None = 30000) -> bool:
        """Wait up to ``timeout_millis`` for the spans queued before the call to be exported.

        True only if every span queued or being exported when the call was made has since been
        accepted by the exporter (and the exporter's own ``force_flush`` did not return False); False on
        a failed export, a span dropped by shutdown, or the timeout. Export goes on in the background
        after a timeout.
        """
        if self._shutdown or threading.current_thread() is self._worker:
            return False
        timeout = 30.0 if timeout_millis is None else max(0.0, timeout_millis / 1000.0)
        deadline = time.monotonic() + timeout
        with self._lock:
            settled = self._taken - (len(self._inflight) if self._inflight is not None else 0)
            target = self._taken + len(self._queue)
            waiter = None
            if target > settled:
                waiter = _FlushWaiter(target)
                self._waiters.append(waiter)
        if waiter is not None:
            self._wake.set()
            if not waiter.done.wait(max(0.0, deadline - time.monotonic())):
                with self._lock:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
                if not waiter.done.is_set():
                    return False
            if not waiter.ok:
                return False
        try:
            flushed = self.exporter.force_flush(max(0, int((deadline - time.monotonic()) * 1000)))
        except Exception:
            with self._lock:
                self._counts["exporter_exceptions"] += 1
            return False
        return flushed is not False

    def shutdown(self) -> None:
        """Export what is queued and stop, within ``shutdown_timeout_millis`` in total.

        Export stops early once an export fails (or the deadline nears): the exporter is then shut
        down, which ends its retry sleeps, and every span not exported is counted in
        ``spans_dropped_shutdown``.
        """
        if self._shutdown:
            return
        end = time.monotonic() + self._shutdown_timeout
        grace = min(STOP_GRACE_SECONDS, self._shutdown_timeout / 4)
        with self._lock:
            self._export_deadline = end - grace
            self._shutdown = True
        self._wake.set()
        self._space.set()
        worker = self._worker
        if worker is not threading.current_thread() and worker.is_alive():
            if not self._healthy:  # the batch in flight is likely sleeping between retries: end that now
                self._stop_exporter(end)
            worker.join(max(0.0, self._export_deadline - time.monotonic()))
            if worker.is_alive():
                self._stop_exporter(end)
                worker.join(max(0.0, end - time.monotonic()))
        with self._lock:
            self._leave_behind_locked()
        self._stop_exporter(end)

    def _stop_exporter(self, end: float) -> None:
        with self._lock:
            if self._exporter_stopped:
                return
            self._exporter_stopped = True
        try:
            if _takes_timeout(self.exporter.shutdown):
                self.exporter.shutdown(timeout_millis=max(0.0, (end - time.monotonic()) * 1000))
            else:
                self.exporter.shutdown()
        except Exception:
            with self._lock:
                self._counts["exporter_exceptions"] += 1


def _takes_timeout(method: Callable[..., Any]) -> bool:
    try:
        return "timeout_millis" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _peek(counter: itertools.count) -> int:
    # itertools.count exposes its next value through repr: "count(N)".
    return int(repr(counter)[6:-1])


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

    def __init__(self, next_processor: SpanProcessor, stats: CaptureStats) -> None:
        super().__init__(next_processor)
        self.stats = stats

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
        if scope is not None and scope.name == SCOPE_NAME:
            self.next_processor.on_end(span)
            return
        attrs = span.attributes or {}
        changed: dict[str, Any] = {}
        for key, value in attrs.items():
            if key in CONTENT_KEYS or key.startswith(CONTENT_PREFIXES):
                new = _redact_value(value, self.redactor)
                if new is not value and new != value:
                    changed[key] = new
        if not changed:
            self.next_processor.on_end(span)
            return
        self.next_processor.on_end(copy_span(span, {**attrs, **changed}))


def _redact_value(value: Any, redactor: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redactor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_value(v, redactor) for v in value)
    if isinstance(value, Mapping):
        return {k: _redact_value(v, redactor) for k, v in value.items()}
    return value


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
) -> tuple[SpanProcessor, QueueingSpanProcessor]:
    """Guard( Redact( SealGuard( Sealing( Queue(exporter) ) ) ) ); returns (chain, queue).

    Redaction comes before sealing so the chain covers exactly what leaves the process. When the
    sealing module is not available the chain runs unsealed and ``sealing_unavailable`` is set.
    """
    sealing_cls = None
    if seal:
        try:
            sealing_cls = _load_sealing()
        except Exception:
            sealing_cls = None
        if sealing_cls is not None:
            _check_seal_options(sealing_cls, seal_options or {})  # a typo is the caller's bug: raise now
    queue = QueueingSpanProcessor(exporter, stats=stats, **dict(queue_options or {}))
    stats.add_source(queue.stats_source)
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
                sealer = sealing_cls(queue, **dict(seal_options or {}))
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
    return GuardedSpanProcessor(head, stats), queue
