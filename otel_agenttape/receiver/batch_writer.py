"""A batch of queued requests into the store, and the write-ahead log replayed into it at startup.

``BatchWriter.write`` stores one batch in one write: the rows of its items (converting those queued
without rows, see ``batchrows.py``), or their messages for a store that takes messages. The Parquet
sink and the stored-span hook (metrics derived from spans) then get exactly the rows it stored; their
failures are counted and logged, never raised, since the store already holds the rows.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_agenttape.receiver.batchrows import batch_tables
from otel_agenttape.receiver.convert import ConvertPool
from otel_agenttape.receiver.metrics import Metrics
from otel_agenttape.receiver.wal import KIND_LOGS, KIND_TRACES, WriteAheadLog
from otel_agenttape.store import rows

log = logging.getLogger(__name__)

_REPLAY_BATCH_BYTES = 32 * 1024 * 1024


def _rows_bytes(tables: dict[str, Any]) -> int:
    return sum(t.get_total_buffer_size() for t in tables.values())


@dataclass
class Queued:
    """One accepted request waiting for the store."""

    seq: int
    kind: int
    request: Any  # the decoded message (stores without ``write_tables``), else None
    payload: bytes | None  # the WAL record, while its rows are still to be built (else None)
    count: int
    size: int
    tables: Any = None  # rows.Tables when the request was converted before it was queued
    at: float = field(default_factory=time.monotonic)  # when it was accepted

    def message(self) -> Any:
        return self.request if self.request is not None else parse_payload(self.kind, self.payload)


def parse_payload(kind: int, payload: bytes) -> Any:
    """Rebuild the request message of a WAL record."""
    msg = ExportTraceServiceRequest() if kind == KIND_TRACES else ExportLogsServiceRequest()
    msg.ParseFromString(payload)
    return msg


class BatchWriter:
    """Writes batches of queued requests to the store and hands what was stored on (sink, hook)."""

    def __init__(self, store: Any, metrics: Metrics, sink: Any = None, on_stored: Any = None,
                 pool: ConvertPool | None = None, pool_threshold: int = 4000, chunk_items: int = 8000,
                 quiet: Any = None) -> None:
        self.store = store
        self.metrics = metrics
        self.sink = sink  # optional ParquetSink: gets exactly the rows each write stored
        self.on_stored = on_stored  # called with each write's stored tables (metrics derived from spans)
        # rows built outside the writer need the store's two-step API (rows, then write_tables)
        self.converts = hasattr(store, "write_tables")
        self.pool = pool
        self.pool_threshold = pool_threshold  # a backlog of this many spans/records starts the pool
        self.chunk_items = chunk_items
        self.quiet = quiet  # quiet.QuietRelease: told of each write, asked at each idle second
        # held by each write from the store to the sink and the hook: an erasure that holds it sees no
        # write between the two (rows stored before it but handed to the Parquet sink after)
        self.handoff = threading.Lock()

    def write(self, batch: list[Queued]) -> None:
        """Store a batch in one write: its rows (converting the items that have none), or its messages."""
        with self.handoff:
            self._write(batch)

    def _write(self, batch: list[Queued]) -> None:
        start = time.perf_counter()
        if self.quiet is not None:
            self.quiet.stored()
        if not self.converts:
            traces = [it.message() for it in batch if it.kind == KIND_TRACES]
            logs = [it.message() for it in batch if it.kind == KIND_LOGS]
            if traces:
                res = self.store.write_traces(traces)
                self._stored(res)
                self.metrics.inc("agenttape_spans_stored_total", getattr(res, "spans_stored", 0))
                self.metrics.inc("agenttape_spans_duplicate_total", getattr(res, "duplicates", 0))
                self._count_conflicts(res)
            if logs:
                res = self.store.write_logs(logs)
                self._stored(res)
                self.metrics.inc("agenttape_logs_stored_total", getattr(res, "logs_stored", 0))
        else:
            tables = rows.concat(batch_tables(batch, self.pool, self.pool_threshold, self.chunk_items))
            res = self.store.write_tables(tables)
            self._stored(res)
            self.metrics.inc("agenttape_store_written_bytes_total", _rows_bytes(res.tables))
            self.metrics.inc("agenttape_spans_stored_total", res.spans_stored)
            self.metrics.inc("agenttape_spans_duplicate_total", res.duplicates)
            self._count_conflicts(res)
            self.metrics.inc("agenttape_logs_stored_total", res.logs_stored)
        self.metrics.observe("agenttape_store_write_seconds", time.perf_counter() - start)

    def replay(self, wal: WriteAheadLog, max_batch_bytes: int) -> int:
        """Apply the records an earlier process left in ``wal``; returns how many records were replayed."""
        records = 0
        batch: list[Queued] = []
        size = 0
        for kind, payload in wal.replay():
            try:
                # read back the way it was read when accepted (``prepare``): rows, or the message
                item = Queued(0, kind, None, payload, 0, len(payload))
                if not self.converts:
                    item.request = parse_payload(kind, payload)
                elif kind == KIND_TRACES:
                    item.tables = rows.traces_to_tables([payload])
                else:
                    item.tables = rows.logs_to_tables([parse_payload(kind, payload)])
            except Exception:  # noqa: BLE001 - a record that passed CRC but not parsing is skipped
                log.warning("skipping an unreadable WAL record of %d bytes", len(payload))
                continue
            batch.append(item)
            records += 1
            size += len(payload)
            if size >= min(max_batch_bytes, _REPLAY_BATCH_BYTES):
                self.write(batch)
                batch, size = [], 0
        if batch:
            self.write(batch)
        wal.drop_replayed()
        self.metrics.inc("agenttape_wal_replayed_records_total", records)
        return records

    def _count_conflicts(self, res: Any) -> None:
        """Re-sent span ids with other content: a buggy client or tampering; the stored span is kept."""
        n = int(getattr(res, "conflicts", 0) or 0)
        if n:
            self.metrics.inc("agenttape_spans_conflicting_total", n)
            log.warning("%d re-sent span(s) differ from the stored span with the same id (e.g. %s): "
                        "kept the stored one", n, getattr(res, "conflict_example", None))

    def _stored(self, res: Any) -> None:
        """The rows a write stored, to the stored-span hook and the Parquet sink."""
        tables = getattr(res, "tables", None)
        if tables and self.on_stored is not None:
            try:
                self.on_stored(tables)
            except Exception as exc:  # noqa: BLE001 - metrics must never fail a write
                self.metrics.inc("agenttape_metrics_errors_total")
                log.error("deriving metrics from stored spans failed: %s", exc)
        if self.sink is None or not tables:
            return
        try:
            self.sink.append(res.tables)
        except Exception as exc:  # noqa: BLE001 - the lake is a copy; DuckDB already holds the rows
            self.metrics.inc("agenttape_parquet_errors_total")
            log.error("parquet sink failed: %s", exc)

    def idle(self) -> None:
        """Nothing stored for a second: let the sink roll its file, tell the store (it gives queries
        back the threads it keeps to one while writing, see ``Store.writes_paused``), and after a longer
        quiet spell give idle memory back (``quiet.py``)."""
        if self.sink is not None:
            try:
                self.sink.maybe_roll()
            except Exception as exc:  # noqa: BLE001 - see _stored
                self.metrics.inc("agenttape_parquet_errors_total")
                log.error("parquet sink failed: %s", exc)
        paused = getattr(self.store, "writes_paused", None)
        if paused is not None:
            try:
                paused()
            except Exception as exc:  # noqa: BLE001 - queries merely stay on fewer threads
                log.warning("store idle hook failed: %s", exc)
        if self.quiet is not None:
            try:
                self.quiet.check()
            except Exception as exc:  # noqa: BLE001 - the memory merely stays in use
                log.warning("releasing idle memory failed: %s", exc)

    def close(self) -> None:
        """Close the sink (the writer thread stopped)."""
        if self.sink is not None:
            try:
                self.sink.close()
            except Exception as exc:  # noqa: BLE001 - see _stored
                log.error("parquet sink failed at close: %s", exc)
