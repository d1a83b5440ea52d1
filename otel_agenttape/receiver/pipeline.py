"""From an accepted request to the store: admission (bounded queue), WAL append, batched store writes.

Transports call ``prepare`` (decode, validate and convert one body: in a converter process once the
pool runs, see ``convert.py``) and then ``accept``, which returns only once the request is durable in
the write-ahead log. One writer thread drains the in-memory queue into the store in large batches
(every request that arrived while the previous batch was being written: one DuckDB transaction),
then tells the WAL those records are applied; each write, and the replay of the WAL at startup, is
``batch_writer.py``'s. Requests queued without rows (accepted as messages, or while the pool was
starting) are converted by the writer, in the workers when the backlog is large. Memory stays
bounded: when the queued bytes pass the limit, ``accept`` holds the request briefly if the writer
is draining, and otherwise raises ``Backpressure`` so the transport answers 429/503 with a retry
delay.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from otel_agenttape.codec.otlp_decode import BodyTooLarge, DecodeError
from otel_agenttape.receiver.batch_writer import BatchWriter, Queued
from otel_agenttape.receiver.convert import ConvertPool
from otel_agenttape.receiver.quiet import QuietRelease
from otel_agenttape.receiver.metrics import Metrics
from otel_agenttape.receiver.prepare import Prepared, prepare
from otel_agenttape.receiver.wal import WriteAheadLog

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_BATCH_ITEMS = 50_000
DEFAULT_MAX_BATCH_BYTES = 128 * 1024 * 1024
# While the writer is draining (it stored a batch within _DRAINING_SECONDS), a full queue holds a
# request up to DEFAULT_ADMISSION_WAIT for room before refusing it: a client told to retry waits at
# least a second (Retry-After is whole seconds), while the writer frees room at its next commit.
# A stalled store gets an immediate 429. At most _MAX_ADMISSION_WAITERS requests wait, so held
# bodies stay bounded too.
DEFAULT_ADMISSION_WAIT = 3.0
_DRAINING_SECONDS = 5.0
_MAX_ADMISSION_WAITERS = 8
_STORE_FAILURES_UNHEALTHY = 3


class Backpressure(Exception):
    """Ingest is behind (``unavailable=False``: 429 / RESOURCE_EXHAUSTED) or not able to store (503 / UNAVAILABLE)."""

    def __init__(self, message: str, retry_after: float, unavailable: bool) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.unavailable = unavailable


class IngestPipeline:
    """Bounded, durable hand-off of decoded requests to one store writer thread."""

    def __init__(
        self,
        store: Any,
        wal: WriteAheadLog,
        metrics: Metrics,
        max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        max_batch_items: int = DEFAULT_MAX_BATCH_ITEMS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        sink: Any = None,
        pool: ConvertPool | None = None,
        pool_threshold: int = 4000,
        chunk_items: int = 8000,
        admission_wait: float = DEFAULT_ADMISSION_WAIT,
        on_stored: Any = None,
        release_after: float = 0.0,
    ) -> None:
        self.store = store
        self.sink = sink  # optional ParquetSink: gets exactly the rows each write stored
        # rows built outside the writer need the store's two-step API (rows, then write_tables)
        self.converts = hasattr(store, "write_tables")
        self.pool = pool if pool is not None and pool.workers > 0 and self.converts else None
        self.pool_threshold = pool_threshold  # a backlog of this many spans/records starts the pool
        # after ``release_after`` quiet seconds, idle memory goes back to the system (quiet.py; 0: never)
        self.quiet = QuietRelease(store, self.pool, release_after, metrics)
        self.writer = BatchWriter(store, metrics, sink, on_stored, self.pool, pool_threshold, chunk_items,
                                  quiet=self.quiet)
        self.wal = wal
        self.metrics = metrics
        self.max_queue_bytes = max_queue_bytes
        self.max_batch_items = max_batch_items
        self.max_batch_bytes = max_batch_bytes
        self.admission_wait = admission_wait
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)
        self._waiters = 0
        self._queue: deque[Queued] = deque()
        self._reserved_bytes = 0  # admitted, not yet in the store (includes WAL appends in flight)
        self._reserved_items = 0
        self._in_flight = 0  # admitted requests not yet in the store
        self._queued_total = 0  # requests queued for the store since start (acknowledged once queued) ...
        self._applied_total = 0  # ... and those of them in the store: batches are taken in queue order
        self._store_failures = 0
        self._last_store_error: str | None = None
        self._closing = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.last_applied_at = 0.0
        self._writing_since: float | None = None  # acceptance time of the oldest item being written

    # -- startup replay -----------------------------------------------------------------------

    def replay_wal(self) -> int:
        """Apply the records an earlier process left in the WAL; returns how many records were replayed."""
        return self.writer.replay(self.wal, self.max_batch_bytes)

    # -- admission ----------------------------------------------------------------------------

    def prepare(self, kind: int, body: bytes, media: str, max_items: int | None = None) -> Prepared:
        """Decode, validate and (for the store's two-step API) convert a request body: in a converter
        process when the pool runs, else in the calling thread. Raises ``DecodeError`` and, past
        ``max_items`` spans or log records, ``TooManyItems``."""
        pool = self.pool
        if pool is not None and pool.running:
            try:
                prepared = pool.prepare(kind, body, media, max_items)
                if prepared is not None:  # else the pool stopped meanwhile (a quiet spell ended): here
                    return prepared
            except (DecodeError, BodyTooLarge):
                raise
            except Exception as exc:  # noqa: BLE001 - a broken worker: prepare here instead
                log.warning("preparing a request in a worker failed (%s); preparing it here", exc)
        elif pool is not None and pool.restart_on_use:
            pool.start_in_background()  # stopped after a quiet spell: requests come again
        return prepare(kind, body, media, convert=self.converts, max_items=max_items)

    def accept(self, kind: int, request: Any, payload: bytes, count: int, tables: Any = None) -> None:
        """Make the request durable (``payload`` in the WAL) and queue it for the store, with its rows
        when they were already converted; raises ``Backpressure`` when full."""
        size = len(payload)
        with self._lock:
            self._admit(size)
            self._reserved_bytes += size
            self._reserved_items += count
            self._in_flight += 1
        try:
            seq = self.wal.append(kind, payload)
        except BaseException:
            with self._lock:
                self._reserved_bytes -= size
                self._reserved_items -= count
                self._in_flight -= 1
                self._idle.notify_all()
            raise
        # rows, or the bytes to convert them from; the message only for stores that take messages.
        # The WAL holds the payload now: queued rows do not keep a second copy of it in memory.
        keep = self.converts and tables is None or not self.converts and request is None
        item = Queued(seq, kind, None if self.converts else request, payload if keep else None, count, size, tables)
        with self._lock:
            self._queue.append(item)
            self._queued_total += 1
            backlog = self._reserved_items
            self._cond.notify()
        if self.pool is not None and not self.pool.running and backlog >= self.pool_threshold:
            self.pool.start_in_background()  # the store is behind: prepare requests in the workers

    def check_admission(self) -> None:
        """Raise ``Backpressure`` when a request would surely be refused, before its body is read."""
        with self._lock:
            self._admit(1)

    def admits_now(self) -> bool:
        """True when ``check_admission`` would pass without waiting (it is then not needed)."""
        with self._lock:
            return not self._closing and self._store_failures < _STORE_FAILURES_UNHEALTHY and self._fits(1)

    def _admit(self, size: int) -> None:
        """With the lock held: return once ``size`` more bytes may be queued, else raise ``Backpressure``."""
        self._raise_if_unavailable()
        if not self._wait_room(size):
            self._raise_if_unavailable()
            self.metrics.inc("agenttape_backpressure_total")
            raise Backpressure(
                f"ingest queue full ({self._reserved_bytes} bytes waiting for the store)",
                self._retry_after(size),
                unavailable=False,
            )

    def _raise_if_unavailable(self) -> None:
        if self._closing:
            raise Backpressure("the receiver is shutting down", 5.0, unavailable=True)
        if self._store_failures >= _STORE_FAILURES_UNHEALTHY:
            raise Backpressure("the store is failing; retry later", 5.0, unavailable=True)

    def _fits(self, size: int) -> bool:
        return not self._reserved_bytes or self._reserved_bytes + size <= self.max_queue_bytes

    def _wait_room(self, size: int) -> bool:
        """With the lock held: True once ``size`` more bytes fit the queue, waiting briefly for the writer."""
        if self._fits(size):
            return True
        if self._waiters >= _MAX_ADMISSION_WAITERS or self.admission_wait <= 0:
            return False
        if time.time() - self.last_applied_at > _DRAINING_SECONDS:
            return False
        deadline = time.monotonic() + self.admission_wait
        self._waiters += 1
        try:
            while not self._fits(size):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closing or self._store_failures >= _STORE_FAILURES_UNHEALTHY:
                    return False
                self._room.wait(remaining)
        finally:
            self._waiters -= 1
        return True

    def _retry_after(self, size: int = 1) -> float:
        """Seconds until the writer has likely made room for ``size`` more bytes (1..10)."""
        rate = self.metrics.store_rate_bytes()
        excess = self._reserved_bytes + size - self.max_queue_bytes
        if rate <= 0 or excess <= 0:
            return 1.0
        return float(min(10.0, max(1.0, round(excess / rate))))

    # -- writer -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._run, name="agenttape-writer", daemon=True)
        self._thread.start()

    def _take_batch(self) -> list[Queued]:
        batch: list[Queued] = []
        items = nbytes = 0
        while self._queue and (not batch or (items < self.max_batch_items and nbytes < self.max_batch_bytes)):
            it = self._queue.popleft()
            batch.append(it)
            items += it.count
            nbytes += it.size
        return batch

    @property
    def store_error(self) -> str | None:
        """Why the store cannot write now (the last failure, while writes keep failing), else None."""
        with self._lock:
            if self._store_failures >= _STORE_FAILURES_UNHEALTHY:
                return self._last_store_error or "store writes are failing"
        return None

    def _wait_for_work(self) -> bool:
        """With the lock held: wait until something is queued; False once stopped and drained."""
        while not self._queue and not self._stopped:
            if not self._cond.wait(1.0):
                self._lock.release()
                try:
                    self.writer.idle()
                finally:
                    self._lock.acquire()
        return bool(self._queue)

    def _retrying(self, write: Any) -> bool:
        """Run ``write()`` until it succeeds; False if stopping while the store keeps failing."""
        delay = 0.05
        while True:
            try:
                write()
                return True
            except Exception as exc:  # noqa: BLE001 - the data is safe in the WAL; retry
                with self._lock:
                    self._store_failures += 1
                    self._last_store_error = f"{type(exc).__name__}: {exc}"
                    self._room.notify_all()
                self.metrics.inc("agenttape_store_errors_total")
                log.error("store write failed (will retry): %s", exc)
                if self._stopped and self._store_failures > 10:
                    return False  # acknowledged data stays in the WAL for the next start
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _applied(self, batch: list[Queued]) -> None:
        nbytes = sum(it.size for it in batch)
        self.metrics.record_store_batch(nbytes)
        self.wal.mark_applied([it.seq for it in batch])
        with self._lock:
            self._store_failures = 0
            self._reserved_bytes -= nbytes
            self._reserved_items -= sum(it.count for it in batch)
            self._in_flight -= len(batch)
            self._applied_total += len(batch)
            self.last_applied_at = time.time()
            self._writing_since = None
            self._idle.notify_all()
            self._room.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._wait_for_work():
                    break
                batch = self._take_batch()
                self._writing_since = min(it.at for it in batch) if batch else None
            if not self._retrying(lambda batch=batch: self.writer.write(batch)):
                return
            self._applied(batch)
            # free the rows (unmapping their spool files takes about a microsecond per span) here,
            # not when the next batch is taken under the lock that admitting requests needs
            del batch
        self.writer.close()

    # -- state --------------------------------------------------------------------------------

    @property
    def queued_bytes(self) -> int:
        return self._reserved_bytes

    @property
    def queued_items(self) -> int:
        return self._reserved_items

    @property
    def queued_requests(self) -> int:
        return self._in_flight

    @property
    def lag_seconds(self) -> float:
        """Age of the oldest accepted request not yet in the store (0 when all are stored)."""
        with self._lock:
            oldest = [t for t in (self._writing_since, self._queue[0].at if self._queue else None) if t is not None]
        return max(0.0, time.monotonic() - min(oldest)) if oldest else 0.0

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every admitted request is in the store; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def wait_stored(self, timeout: float) -> bool:
        """Block until every request queued before this call is in the store (what a client was told
        was accepted is then queryable), at most ``timeout`` seconds; False when it was not reached.
        Requests queued meanwhile are not waited for, so steady ingest does not hold a read back."""
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._queued_total
            while self._applied_total < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self, timeout: float = 30.0) -> bool:
        """Refuse new requests, drain the queue into the store and stop; True when everything was stored."""
        with self._lock:
            self._closing = True
            self._room.notify_all()
        drained = self.wait_idle(timeout)
        with self._lock:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, timeout))
        if self.pool is not None:
            self.pool.close()
        return drained
