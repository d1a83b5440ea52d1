"""The export queue: a bounded queue of ended spans, one worker thread that delivers them, and a
shutdown with one total bound. Spans it cannot deliver go to the outbox when there is one."""

from __future__ import annotations

import collections
import inspect
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_agenttape.capture.delivery import Sent, encode_bounded
from otel_agenttape.capture.stats import CaptureStats, _peek

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE_SIZE = 8192
DEFAULT_MAX_EXPORT_BATCH_SIZE = 512
DEFAULT_SCHEDULE_DELAY_MILLIS = 200
DEFAULT_ENQUEUE_TIMEOUT_MILLIS = 1000  # the most one span end waits for room in a full queue
DEFAULT_SHUTDOWN_TIMEOUT_MILLIS = 10000  # the whole of shutdown(), final checkpoints and outbox writes included
# The last part of the shutdown budget: the exporter is shut down (ending its retry sleeps) and the
# batch in flight gets this long to come back before it is counted as dropped (or written to the outbox).
STOP_GRACE_SECONDS = 0.5
_EXPORT_COUNTERS = ("spans_exported", "spans_export_failed", "export_batches", "export_failures",
                    "exporter_exceptions", "dropped_attributes", "dropped_events", "dropped_links",
                    "spans_to_outbox", "spans_spilled", "spans_dropped_too_large", "spans_refused",
                    "requests_split")

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
    ``enqueue_timeout_millis`` for the worker to make room, but only while the exporter is healthy and
    the queue is not saturated: once an export fails, or the producers' waits add up to
    ``enqueue_timeout_millis``, a full queue drops (counted) at once until the backend has caught up
    (less than a batch queued), so neither a span end (with the checkpoint it may emit) waits at
    most ``enqueue_timeout_millis`` in all, however slow the backend, nor is the agent held to a slow
    backend's pace. With an ``outbox``, a full queue
    never waits for the network: the span goes to the outbox's writer; failed requests, and every
    batch while the outbox holds records (to keep the order), are written to the outbox.

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
        outbox: Any = None,
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
        self._saturated = False  # the waits for room ran out: drop (or spill) at once until caught up
        self._waited = 0.0  # seconds producers waited for room since the backend last caught up
        self._shutdown_end: float | None = None  # set when shutdown begins (before the final checkpoints)
        self.outbox = outbox
        self._deliver_spans = getattr(exporter, "deliver_spans", None)
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
        if self.outbox is not None:
            try:
                self.outbox = self.outbox.forked()
            except Exception:  # noqa: BLE001 - the child then records without an outbox
                self.outbox = None
        self._wake = threading.Event()
        self._space = threading.Event()
        self._start_worker()

    # ---- producer side (on_start and _on_ending are SpanProcessor's no-ops) ------------------
    def on_end(self, span: ReadableSpan) -> None:
        if self._shutdown:
            next(self._dropped_shutdown)
            return
        queue = self._queue
        if len(queue) >= self.max_queue_size:
            outbox = self.outbox
            if outbox is not None:
                self._wake.set()
                if outbox.spill(span, self._enqueue_timeout if self._shutdown_end is None else 0.0):
                    with self._lock:
                        self._counts["spans_spilled"] += 1
                else:
                    next(self._dropped_full)
                return
            if not self._wait_for_space():
                next(self._dropped_full)
                return
        queue.append(span)
        next(self._queued)
        if len(queue) >= self.max_export_batch_size and not self._wake.is_set():
            self._wake.set()

    def _wait_for_space(self) -> bool:
        """Wait for room, but at most ``enqueue_timeout`` in all (every producer together) until the
        backend has caught up: a slow receiver frees a slot now and then, and waiting for each of
        them would hold the agent to the receiver's pace."""
        if (not self._healthy or self._saturated or self._shutdown_end is not None
                or threading.current_thread() is self._worker):
            return False
        next(self._blocked)
        start = time.monotonic()
        deadline = start + max(0.0, self._enqueue_timeout - self._waited)
        self._wake.set()
        try:
            while len(self._queue) >= self.max_queue_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._saturated = True  # the next span ends (this call's checkpoint too) do not wait
                    return False
                if self._shutdown or not self._healthy or self._saturated or self._shutdown_end is not None:
                    return False
                self._space.clear()
                if len(self._queue) < self.max_queue_size:
                    break
                self._space.wait(min(remaining, 0.05))
            return True
        finally:
            self._waited += time.monotonic() - start

    # ---- worker side -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._shutdown:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._drain()
        self._drain()

    def _drain(self) -> None:
        """Export what was queued when the worker woke (in batches), then go back to sleep: spans that
        end meanwhile wait for the next tick unless a full batch of them waits, a flush wants them or
        the queue shuts down. (Draining until the queue is empty would send a request for every span
        or two that ends during an export: each request costs the app more CPU than its spans.)"""
        queue = self._queue
        with self._lock:
            goal = self._taken + len(queue)
        while True:
            with self._lock:
                if not queue:
                    return
                if (self._taken >= goal and len(queue) < self.max_export_batch_size and not self._shutdown
                        and not any(w.target > self._taken for w in self._waiters)):
                    return
                left = None
                if self._shutdown and not self._may_export_locked():
                    left = self._leave_behind_locked()
            if left is not None:
                if left:
                    self._left_to_outbox(left)
                return
            with self._lock:
                if not queue:
                    return
                count = min(self.max_export_batch_size, len(queue))
                batch = [queue.popleft() for _ in range(count)]
                self._taken += count
                self._inflight = batch
                if len(queue) < self.max_export_batch_size and (self._saturated or self._waited):
                    self._saturated = False  # the backend caught up: a full queue may wait again
                    self._waited = 0.0
            self._space.set()
            sent = self._export(batch)
            with self._lock:
                if self._inflight is not batch:  # shutdown gave up on it and counted it
                    return
                self._inflight = None
                end = self._taken  # the batch's sequence numbers are [end - count, end)
            ok = self._settle(sent, count)
            with self._lock:
                if sent.routed:  # not an export attempt: the receiver's health is the outbox's to tell
                    self._notify_locked(end - count, end, False)
                else:
                    self._settle_locked(count, ok, not sent.undelivered, end)

    def _may_export_locked(self) -> bool:
        """During shutdown: export only while the exporter works and the deadline is ahead."""
        healthy = self._healthy
        if not healthy and self.outbox is not None:
            healthy = self.outbox.receiver_ok and not self.outbox.backlog()  # it came back since
        return healthy and not self._exporter_stopped and time.monotonic() < self._export_deadline

    def _export(self, batch: list[ReadableSpan]) -> Sent:
        """Deliver a batch (or, while the outbox holds records, queue it behind them): what became of it."""
        counts = self._counts
        for span in batch:
            try:
                counts["dropped_attributes"] += span.dropped_attributes
                counts["dropped_events"] += span.dropped_events
                counts["dropped_links"] += span.dropped_links
            except Exception:
                pass
        outbox = self.outbox
        if outbox is not None and outbox.backlog():
            sent = self._for_outbox(batch)
            sent.routed = True
            return sent
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            if self._deliver_spans is not None:
                return self._deliver_spans(batch)
            if self.exporter.export(batch) is SpanExportResult.SUCCESS:
                return Sent(delivered=len(batch))
        except Exception:
            with self._lock:
                counts["exporter_exceptions"] += 1
        finally:
            detach(token)
        return self._for_outbox(batch) if outbox is not None else Sent(undelivered=[(b"", len(batch))])

    def _for_outbox(self, batch: list[ReadableSpan]) -> Sent:
        requests, too_large = encode_bounded(batch, self.outbox.max_request_bytes)
        return Sent(too_large=too_large, undelivered=requests)

    def _settle(self, sent: Sent, count: int) -> bool:
        """Count what became of a batch; undelivered requests go to the outbox if there is one."""
        kept = sent.kept
        written = self.outbox.write_requests(sent.undelivered) if self.outbox is not None and kept else 0
        with self._lock:
            counts = self._counts
            counts["spans_exported"] += sent.delivered
            counts["spans_dropped_too_large"] += sent.too_large
            counts["spans_refused"] += sent.refused
            counts["requests_split"] += sent.splits
            counts["spans_to_outbox"] += written
            counts["spans_export_failed"] += kept - written
        return not (kept or sent.refused or sent.too_large)

    def _settle_locked(self, count: int, ok: bool, delivered: bool, end: int) -> None:
        counts = self._counts
        counts["export_batches"] += 1
        if not ok:
            counts["export_failures"] += 1
        self._healthy = delivered  # a span too large or refused says nothing about the receiver's health
        self._notify_locked(end - count, end, ok)

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

    def _leave_behind_locked(self) -> list[ReadableSpan]:
        """Shutdown stops exporting: settle what is queued or in flight; returned for the outbox,
        else counted as dropped."""
        inflight = self._inflight
        start = self._taken - (len(inflight) if inflight is not None else 0)
        left = list(inflight) if inflight is not None else []
        self._inflight = None
        queue = self._queue
        while True:  # popleft, not clear(): a span appended meanwhile is either counted or stays queued
            try:
                left.append(queue.popleft())
            except IndexError:
                break
            self._taken += 1
        if left:
            if self.outbox is None:
                self._left_behind += len(left)
            self._notify_locked(start, self._taken, False)
        self._space.set()
        return left if self.outbox is not None else []

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
        self.begin_shutdown()
        end = self._shutdown_end
        grace = min(STOP_GRACE_SECONDS, self._shutdown_timeout / 4)
        if self.outbox is not None:  # and as long again to write what is left to the outbox
            grace = min(2 * grace, self._shutdown_timeout / 2)
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
            left = self._leave_behind_locked()
        if left:
            self._left_to_outbox(left)
        self._stop_exporter(end)
        if self.outbox is not None:
            self.outbox.close(end)

    def begin_shutdown(self) -> None:
        """Start the shutdown clock: from now on no span end waits, and ``shutdown()`` ends within
        ``shutdown_timeout_millis`` of this moment (the chain calls it before the final checkpoints)."""
        if self._shutdown_end is None:
            self._shutdown_end = time.monotonic() + self._shutdown_timeout

    def _left_to_outbox(self, left: list[ReadableSpan]) -> None:
        try:
            written, too_large = self.outbox.write_spans(left)
        except Exception:  # noqa: BLE001 - counted as dropped, never raised into the agent
            written, too_large = 0, 0
        with self._lock:
            self._counts["spans_to_outbox"] += written
            self._counts["spans_dropped_too_large"] += too_large
            self._left_behind += len(left) - written - too_large

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
