"""Request preparation in worker processes, so ingest uses more than one core.

Decoding a request and converting its spans to Arrow rows (``prepare.py``, ``store/rows.py``) is
Python code bound by the GIL. Once the pool runs, every request body goes to a worker process, which
decodes, validates and converts it in one pass and returns the answer for the client with the rows;
the main process only reads bodies, appends them to the WAL and inserts rows. Requests that were
accepted as decoded messages (before the pool started, or through ``IngestPipeline.accept``) are
converted by the workers in chunks when their backlog is large.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from otel_agenttape.receiver import spool
from otel_agenttape.receiver.wal import KIND_TRACES

log = logging.getLogger(__name__)

_WORKER_NICENESS = 5  # converters yield the CPU to the main process (see _init_worker)


def convert_payloads(kind: int, payloads: list[bytes]) -> Any:
    """Worker side: serialized (already validated) requests -> ``rows.Tables``."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest,
    )

    from otel_agenttape.store import rows

    if kind == KIND_TRACES:
        return rows.traces_to_tables(payloads)
    return rows.logs_to_tables([ExportLogsServiceRequest.FromString(p) for p in payloads])


def prepare_body(
    kind: int, body_path: str, size: int, media: str, folder: str, rows_path: str | None = None,
    max_items: int | None = None,
) -> Any:
    """Worker side: ``prepare.prepare`` (decode, validate, convert) of one request body in the spool;
    the rows go back through the spool too, into ``rows_path`` when the main process has one to reuse.
    After a large request the worker hands the memory it took back to the system."""
    from otel_agenttape.receiver.prepare import TRIM_BYTES, prepare, release_memory

    try:
        prepared = prepare(kind, spool.take_body(body_path, size), media, max_items=max_items)
        if prepared.tables is not None:
            prepared.tables = spool.put_tables(folder, prepared.tables, rows_path)
        return prepared
    finally:
        if size >= TRIM_BYTES:
            release_memory()


def _init_worker(parent: int) -> None:
    # Ctrl-C reaches the whole process group: the server shuts its workers down itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The main process (bodies, WAL, inserts, answers) is the one part that cannot run in parallel:
    # under load it keeps a core busy by itself. Converters yield to it. On 2 cores, with 2 converters
    # at equal priority the scheduler time-sliced all three and bench/ingest.py stored about 46,000
    # spans/s; with the converters at nice +5, about 53,000 (and, with spans whose content never
    # repeats, 35,000 against 27,000 with one converter).
    try:
        os.nice(_WORKER_NICENESS)
    except OSError:  # not allowed here: equal priority still works
        pass
    # a server killed with SIGKILL cannot: a worker leaves once its parent is gone
    threading.Thread(target=_exit_with_parent, args=(parent,), name="agenttape-parent-watch", daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _warm() -> int:
    from otel_agenttape.receiver import prepare  # noqa: F401 - import once per worker, before the clock matters
    from otel_agenttape.store import rows  # noqa: F401

    return os.getpid()


def default_workers() -> int:
    """One converter per core, at most 4 (none on a single core: the main process needs it)."""
    n = os.cpu_count() or 1
    return 0 if n < 2 else min(4, n)


def stop_resource_tracker() -> bool:
    """Stop multiprocessing's resource tracker, the process that a spawned pool starts to remove its
    semaphores should this one die (an interpreter of its own: about 15 MB). Once the pool is gone it
    tracks nothing; the next pool starts it again. Returns whether it was running and stopped."""
    import gc
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    stop = getattr(tracker, "_stop", None)  # CPython's own (3.8 and later); elsewhere it stays
    if stop is None or getattr(tracker, "_fd", None) is None:
        return False
    gc.collect()  # the stopped pool's queues: their semaphores are unregistered as they are freed
    try:
        stop()
    except Exception as exc:  # noqa: BLE001 - it merely keeps running
        log.debug("the resource tracker stays: %s", exc)
        return False
    return True


class ConvertPool:
    """A lazily started pool of spawned converter processes."""

    def __init__(self, workers: int, spool_bytes: int = spool.KEEP_TOTAL * 2) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._starting = False
        self._closed = False
        self._spool: str | None = None
        self._bodies = spool.Recycler(spool_bytes // 2)  # spool files to write again
        self._rows = spool.Recycler(spool_bytes // 2)
        self._busy = 0  # requests and chunks in the workers now
        self.last_used = time.monotonic()  # when a request or chunk last went to the workers
        # start again at the next request after ``stop`` (a long-running server's pool, see ``stop``)
        self.restart_on_use = False

    @property
    def running(self) -> bool:
        """True once the workers are up (requests then go to them)."""
        return self._pool is not None

    @property
    def spool_folder(self) -> str | None:
        """The shared-memory folder of the hand-off files, once the workers run."""
        return self._spool

    def drop_kept_files(self) -> int:
        """Remove the hand-off files kept for reuse (an erasure: they hold earlier request bodies and
        rows), and each file in use now once it is given back, unless it was written again since (a
        write cuts a file to its new content). Returns how many were removed now."""
        import gc
        import time

        now = time.time_ns()
        gc.collect()  # rows no longer referenced but in a cycle: their files come back to be removed
        n = len(self._bodies.paths()) + len(self._rows.paths())
        self._bodies.clear(now)
        self._rows.clear(now)
        return n

    def start(self) -> None:
        """Spawn the workers and import the converter in each (idempotent, thread-safe)."""
        with self._lock:
            if self._pool is None and self.workers > 0 and not self._closed:
                pool = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                    initargs=(os.getpid(),),
                )
                for f in [pool.submit(_warm) for _ in range(self.workers)]:
                    f.result()
                self._spool = spool.create()
                self._pool = pool

    def start_in_background(self) -> None:
        """``start`` in a thread, once; the caller goes on without waiting (also while a start is under
        way: ``start`` holds the lock for as long as the workers take to come up)."""
        if self._starting or self._pool is not None:  # read without the lock: a stale answer only means
            return  # one more pass below, or a start left to the next request
        with self._lock:
            if self._pool is not None or self._starting or self._closed or self.workers <= 0:
                return
            self._starting = True
        threading.Thread(target=self._start_quietly, name="agenttape-convert-start", daemon=True).start()

    def _start_quietly(self) -> None:
        try:
            self.start()
        except Exception as exc:  # noqa: BLE001 - requests are then prepared in the main process
            log.warning("could not start the row-conversion workers: %s", exc)
        finally:
            with self._lock:
                self._starting = False

    def stop(self, quiet_seconds: float = 0.0) -> bool:
        """Stop the workers and drop the hand-off files when nothing went to them for ``quiet_seconds``
        and nothing is in them now: a quiet receiver gives their memory back (each worker holds its own
        interpreter, about 70 MB). Requests are then prepared in the main process until the pool starts
        again: on a backlog, or at the next request when ``restart_on_use``. Returns whether it stopped."""
        with self._lock:
            pool = self._pool
            if (pool is None or self._busy or self._starting
                    or time.monotonic() - self.last_used < quiet_seconds):
                return False
            self._pool = None
            folder, self._spool = self._spool, None
            now = time.time_ns()  # a file still in use is removed when given back, not kept for reuse
            self._bodies.clear(now)
            self._rows.clear(now)
        pool.shutdown(wait=True, cancel_futures=True)
        del pool
        if folder is not None:
            spool.remove(folder)
        stop_resource_tracker()
        log.info("row-conversion workers stopped after %.0f s without requests", quiet_seconds)
        return True

    def _enter(self) -> tuple[ProcessPoolExecutor | None, str | None]:
        """The running pool and its spool folder, counted busy until ``_leave``."""
        with self._lock:
            self._busy += 1
            self.last_used = time.monotonic()
            return self._pool, self._spool

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1
            self.last_used = time.monotonic()

    def submit(self, kind: int, payloads: list[bytes]) -> Future:
        """Convert already validated requests in a worker (starting the pool if needed)."""
        self.start()
        pool, _ = self._enter()
        try:
            if pool is None:
                raise RuntimeError("the conversion pool is closed")
            future = pool.submit(convert_payloads, kind, payloads)
        except BaseException:
            self._leave()
            raise
        future.add_done_callback(lambda f: self._leave())
        future.add_done_callback(lambda f: self._discard(pool) if not f.cancelled() and isinstance(
            f.exception(), BrokenProcessPool) else None)
        return future

    def prepare(self, kind: int, body: bytes, media: str, max_items: int | None = None) -> Any:
        """Decode, validate and convert one request body in a worker; returns its ``Prepared``, or None
        when the pool is not running (not started, or stopped since the caller looked). Raises what
        ``prepare.prepare`` raises (``DecodeError``, ``TooManyItems``)."""
        pool, folder = self._enter()
        try:
            if pool is None or folder is None:
                return None
            return self._prepare(pool, folder, kind, body, media, max_items)
        finally:
            self._leave()

    def _prepare(self, pool: ProcessPoolExecutor, folder: str, kind: int, body: bytes, media: str,
                 max_items: int | None) -> Any:
        path = spool.put_body(folder, body, self._bodies.take())
        rows_path = self._rows.take()
        try:
            prepared = pool.submit(prepare_body, kind, path, len(body), media, folder, rows_path,
                                   max_items).result()
        except BaseException as exc:
            if rows_path is not None:
                self._give_rows(rows_path)
            if isinstance(exc, BrokenProcessPool):
                self._discard(pool)
            raise
        finally:
            self._bodies.give(path, len(body))  # read by now, or never going to be
        if prepared.tables is not None:
            if rows_path is not None and prepared.tables.path != rows_path:
                self._give_rows(rows_path)
            prepared.tables = spool.take_tables(prepared.tables, self._rows)
        elif rows_path is not None:
            self._give_rows(rows_path)
        return prepared

    def _give_rows(self, path: str) -> None:
        """Keep a rows file the worker did not use (dropped if it is gone)."""
        try:
            size = os.path.getsize(path)
        except OSError:
            return
        self._rows.give(path, size)

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        """A worker died (killed, out of memory): drop the broken pool and start a new one."""
        with self._lock:
            if self._pool is not pool:
                return
            self._pool = None
        log.warning("a row-conversion worker died; restarting the workers")
        pool.shutdown(wait=False, cancel_futures=True)
        self.start_in_background()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            folder, self._spool = self._spool, None
            self._bodies.clear()
            self._rows.clear()
        # outside the lock: a finished conversion's callbacks (``_leave``, ``_discard``) take it, and
        # they run on the executor's own thread, which the shutdown waits for
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if folder is not None:
            spool.remove(folder)
