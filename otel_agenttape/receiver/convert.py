"""Row conversion in worker processes, so a large ingest uses more than one core.

Converting OTLP spans to Arrow rows (``store/rows.py``) is Python code bound by the GIL; the receiver's
main process already spends its time on HTTP, decoding and DuckDB inserts. Large batches are split
into chunks converted by a small pool of spawned processes (from the serialized request bytes the WAL
holds), and the writer inserts the resulting tables in order while the next chunks convert.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from otel_agenttape.receiver.wal import KIND_TRACES


def convert_payloads(kind: int, payloads: list[bytes]) -> Any:
    """Worker side: serialized requests -> ``rows.Tables``."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from otel_agenttape.store import rows

    if kind == KIND_TRACES:
        return rows.traces_to_tables([ExportTraceServiceRequest.FromString(p) for p in payloads])
    return rows.logs_to_tables([ExportLogsServiceRequest.FromString(p) for p in payloads])


def _init_worker() -> None:
    # Ctrl-C reaches the whole process group: the server shuts its workers down itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _warm() -> int:
    from otel_agenttape.store import rows  # noqa: F401 - import once per worker, before the clock matters

    return os.getpid()


def default_workers() -> int:
    """One converter per core, at most 4 (none on a single core: the main process needs it)."""
    n = os.cpu_count() or 1
    return 0 if n < 2 else min(4, n)


class ConvertPool:
    """A lazily started pool of spawned converter processes."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Spawn the workers and import the converter in each (idempotent, thread-safe)."""
        with self._lock:
            if self._pool is None and self.workers > 0:
                pool = ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=mp.get_context("spawn"), initializer=_init_worker
                )
                for f in [pool.submit(_warm) for _ in range(self.workers)]:
                    f.result()
                self._pool = pool

    def submit(self, kind: int, payloads: list[bytes]) -> Future:
        self.start()
        assert self._pool is not None
        return self._pool.submit(convert_payloads, kind, payloads)

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
