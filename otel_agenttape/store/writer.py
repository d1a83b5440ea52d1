"""The single writer of a DuckDB tape store.

One process owns a DuckDB file (DuckDB allows one writing process). Each batch is converted to Arrow
(``rows.py``), checked against stored keys, and inserted in one transaction, so a re-sent span
(same trace id + span id) or log record (same ``log_id``) is stored once.

Stored keys are checked in two steps so the cost of a write does not grow with the table scan: an
in-memory set of the 64-bit ``hash(trace_id || span_id)`` of every stored span (sorted arrays, 8 bytes
per key, rebuilt from the table when the store opens) clears new keys with a binary search; only keys
whose hash is already there (re-sent spans, or a 64-bit hash collision) go to an exact semi-join on
the table. A PRIMARY KEY (ART index) over random hex ids makes every insert slower and keeps growing
in memory (``bench/store_size.py``). Log records work the same way on ``log_id``.

The writer also keeps ``run_index`` (``store.ddl``): one row per (run, trace) and written batch, keyed by
the hashes of the run and trace ids, with the time range and the ``spans`` row range of that batch, so
a run is found without scanning ``spans.run_id`` (``run_bounds``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from otel_agenttape.store import rows, schema
from otel_agenttape.store.ddl import INDEX_ROW_SQL, create_schema, run_hash_where
from otel_agenttape.store.keyfilter import KeyFilter
from otel_agenttape.store.readers import StoreOpenError, open_error_message
from otel_agenttape.store.rewrite_gate import RewriteGate, StoreReader

T = TypeVar("T")


@dataclass
class WriteResult:
    """What one write stored. ``tables`` holds exactly the rows inserted (for the Parquet sink)."""

    spans_stored: int = 0
    duplicates: int = 0  # re-sent spans and log records identical to the stored ones
    conflicts: int = 0  # re-sent spans whose content differs from the stored span (the stored one is kept)
    conflict_example: str | None = None  # "trace_id/span_id" of one of them, for the log
    logs_stored: int = 0
    tables: dict[str, pa.Table] = field(default_factory=dict, repr=False)
    span_hashes: Any = field(default=None, repr=False)  # key hashes of the stored rows, until commit
    log_hashes: Any = field(default=None, repr=False)


DEFAULT_MEMORY_LIMIT = "512MB"
_GIVE_BACK_KEYS = 100_000  # a store holding this many keys gives back what building its filters cached


def locked_config(threads: int | None = None, memory_limit: str | None = None) -> dict[str, Any]:
    """DuckDB settings for every store database: no file/network access beyond the database itself,
    no extension loading, settings frozen. Queries served from this database (``/api/query``) then
    cannot reach the file system even if a statement check were bypassed."""
    config: dict[str, Any] = {
        "enable_external_access": False,
        "autoload_known_extensions": False,
        "autoinstall_known_extensions": False,
        "lock_configuration": True,
    }
    if threads:
        config["threads"] = int(threads)
    if memory_limit:
        # bounds the buffer pool (RSS otherwise grows with the store); past it DuckDB evicts or spills
        config["memory_limit"] = memory_limit
    return config


def _buffer_bytes(con: duckdb.DuckDBPyConnection) -> int:
    """Bytes DuckDB holds in memory now (its buffer manager's tags)."""
    return int(con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()").fetchall()[0][0])


def _key(table: pa.Table, cols: list[str]) -> pa.Array:
    if len(cols) == 1:
        return table.column(cols[0])
    return pc.binary_join_element_wise(*[table.column(c) for c in cols], "")


# Where a run's rows are: the rowid ranges (spans, span_events, span_links) of every write that held
# one of its spans. Then ``SELECT ... FROM spans WHERE rowid BETWEEN ? AND ? AND run_id = ?`` reads
# only those row groups (and the same for span_events/span_links with their ranges and the trace ids).
RUN_LOOKUP_SQL = """SELECT min(first_span_row) AS first_span_row, max(last_span_row) AS last_span_row,
       min(first_event_row) AS first_event_row, max(last_event_row) AS last_event_row,
       min(first_link_row) AS first_link_row, max(last_link_row) AS last_link_row,
       min(start_time_unix_nano) AS start_time_unix_nano, max(end_time_unix_nano) AS end_time_unix_nano,
       sum(spans)::BIGINT AS spans
FROM run_index WHERE """  # + the run's key (``ddl.run_hash_where``)
_RUN_LOOKUP_COLUMNS = ("first_span_row", "last_span_row", "first_event_row", "last_event_row", "first_link_row",
                       "last_link_row", "start_time_unix_nano", "end_time_unix_nano", "spans")

_SPAN_KEY = "trace_id || span_id"
log = logging.getLogger(__name__)

# A re-sent span differs from the stored one when any column does (every column comes from the span
# itself: nothing is stamped at receive time, so an honest re-send is identical).
_SPAN_DIFFERS = " OR ".join(f"n.{c} IS DISTINCT FROM s.{c}" for c in schema.column_names("spans"))


def _rows_bytes(t: rows.Tables) -> int:
    """Bytes of the rows a write inserts (the sizes of their Arrow buffers: ``nbytes`` would walk every
    string offset, about 2.7 ms for 14,000 bench spans against 0.2)."""
    return sum(x.get_total_buffer_size() for x in (t.spans, t.span_events, t.span_links, t.log_records))


def _hashes(con: duckdb.DuckDBPyConnection, view: str, key_sql: str) -> np.ndarray:
    t = con.sql(f"SELECT hash({key_sql}) FROM {view}").to_arrow_table()
    return t.column(0).to_numpy().astype(np.uint64, copy=False)


# DuckDB checkpoints at a commit when its WAL plus its size estimate of the transaction passes
# ``checkpoint_threshold`` (default 16 MiB), and then skips writing the transaction to the WAL. The
# estimate counts a string as its fixed-size slot, not its text: a receiver batch of 14,000 ~2.7 KB
# spans (~55 MB of Arrow rows) is estimated under 16 MiB, so every second such batch went to the WAL
# in full (serialized, written, fsync'd) only to be checkpointed with the next one. A write of at
# least BIG_WRITE_BYTES of rows (Arrow) therefore lowers the threshold so that it checkpoints at its
# own commit, without the WAL: 8.2-8.9 instead of 11.4-11.6 us per span for batches of 14,000.
# Smaller writes keep the default and collect in the WAL, so their rows are compressed together in
# row groups as large as before. The setting stays until the other kind of write comes.
BIG_WRITE_BYTES = 16 * 1024 * 1024
_CHECKPOINT_DEFAULT = "16MiB"  # DuckDB's own default
_CHECKPOINT_AT_ONCE = "1MB"


class Store:
    """A DuckDB tape store. ``Store(None)`` is in memory (tests, OTLP files).

    Raises ``StoreOpenError`` (an ``OSError``) with a one-line reason when the file cannot be opened.
    """

    def __init__(self, path: str | None = None, *, threads: int | None = None,
                 memory_limit: str | None = DEFAULT_MEMORY_LIMIT, write_threads: int | None = 1) -> None:
        self.path = path
        # an in-memory store keeps its rows in the buffer pool: no limit there
        config = locked_config(threads, memory_limit if path else None)
        # DuckDB's thread count is one setting for the whole database. Inserting an Arrow batch from
        # several threads costs about three times the CPU of one thread, and ingest is bound by CPU,
        # not by one core. So writes switch the database to ``write_threads`` and it stays there
        # while writes keep coming (switching back costs DuckDB about as much as a write saves);
        # ``writes_paused`` gives reads (``/api/query``) every thread again once writes stop. Only
        # ``threads`` is changeable: every other setting remains locked.
        self._write_threads = int(write_threads) if write_threads else None
        self._writing = False  # the database runs with write_threads
        allowed = ["threads"] if self._write_threads else []
        self._checkpoints = bool(path)  # an in-memory store never checkpoints
        self._checkpoint_at_once = False  # checkpoint_threshold is _CHECKPOINT_DEFAULT
        if path:
            allowed.append("checkpoint_threshold")  # see BIG_WRITE_BYTES
        self._memory_limit = memory_limit if path else None
        if self._memory_limit:
            allowed.append("memory_limit")  # lowered for a moment to give cached blocks back (release_memory)
        if allowed:
            config["allowed_configs"] = allowed
        # Rows are only appended, never deleted, so a checkpoint has nothing to vacuum; but by default
        # it merges the row groups of consecutive batches into full ones, compressing the same rows
        # again and again (every second batch, fourth, eighth...). Without that, each batch's rows
        # are compressed once: writes cost about a third less CPU, the file is no larger, and scans
        # read row groups of a batch or more (tens of thousands of rows under load).
        config["max_vacuum_tasks"] = 0
        self._config = config
        try:
            self.con = duckdb.connect(path or ":memory:", config=config)
        except duckdb.Error as exc:
            # in use by another process, not a DuckDB file, a folder, a missing parent folder...
            raise StoreOpenError(open_error_message(str(path), exc)) from exc
        self._read_threads = int(self.con.sql("SELECT current_setting('threads')").fetchall()[0][0])
        if self._write_threads == self._read_threads:
            self._write_threads = None
        self._lock = threading.Lock()
        self.gate = RewriteGate()  # reads wait while ``exclusive`` rewrites the file
        self.generation = 0  # bumped each time the database is opened again (readers renew their cursor)
        try:
            create_schema(self.con)
        except duckdb.Error as exc:  # e.g. a read-only file system, or a file from an incompatible version
            self.con.close()
            raise StoreOpenError(open_error_message(str(path), exc)) from exc
        self._span_keys = KeyFilter(self.con, "spans", _SPAN_KEY)
        self._log_keys = KeyFilter(self.con, "log_records", "log_id")
        self._rows = self._row_counts()
        self._closed = False
        if self._span_keys.count + self._log_keys.count >= _GIVE_BACK_KEYS:
            # the filters read every stored key: those blocks and the Arrow buffers they were read into
            # are not needed again soon (a new span's exact check reads a few of them)
            self.release_memory()
            pa.default_memory_pool().release_unused()

    def run_bounds(self, run_id: str) -> dict[str, Any] | None:
        """Where the spans of ``run_id`` are (``RUN_LOOKUP_SQL``), or None for an unknown run."""
        cur = self.con.cursor()
        try:
            where, params = run_hash_where(run_id)
            found = cur.execute(RUN_LOOKUP_SQL + where, params).fetchall()
        finally:
            cur.close()
        row = found[0] if found else None
        if row is None or row[0] is None:
            return None
        return dict(zip(_RUN_LOOKUP_COLUMNS, row))

    # -- writes -------------------------------------------------------------------------------
    def write_traces(self, requests: Iterable[Any]) -> WriteResult:
        """Store the spans (with events, links, resources) of ``ExportTraceServiceRequest`` messages."""
        return self.write_tables(rows.traces_to_tables(requests))

    def write_logs(self, requests: Iterable[Any]) -> WriteResult:
        """Store the log records (and resources) of ``ExportLogsServiceRequest`` messages."""
        return self.write_tables(rows.logs_to_tables(requests))

    def write_tables(self, t: rows.Tables) -> WriteResult:
        """Insert converted rows, skipping keys already stored; one transaction."""
        with self._lock:
            con = self.con
            if self._write_threads and not self._writing:
                con.execute(f"SET threads = {self._write_threads}")
                self._writing = True
            if self._checkpoints:
                at_once = _rows_bytes(t) >= BIG_WRITE_BYTES
                if at_once != self._checkpoint_at_once:
                    threshold = _CHECKPOINT_AT_ONCE if at_once else _CHECKPOINT_DEFAULT
                    con.execute(f"SET checkpoint_threshold = '{threshold}'")
                    self._checkpoint_at_once = at_once
            con.begin()
            try:
                result = self._insert(con, t)
                if result.spans_stored:
                    self._span_keys.added(con, result.span_hashes)
                if result.logs_stored:
                    self._log_keys.added(con, result.log_hashes)
                con.commit()
            except BaseException as exc:
                self._abort(exc)
                raise
            finally:
                for name in ("_n_spans", "_n_events", "_n_links", "_n_logs", "_n_res"):
                    try:
                        con.unregister(name)
                    except Exception:  # noqa: BLE001 - not registered in this batch
                        pass
            rows_added = result.tables
            self._rows = [self._rows[0] + rows_added["spans"].num_rows, self._rows[1] + rows_added["span_events"].num_rows,
                          self._rows[2] + rows_added["span_links"].num_rows]
            result.span_hashes = result.log_hashes = None
        return result

    def writes_paused(self) -> None:
        """No write is coming soon: let reads use every thread again (see ``write_threads``)."""
        with self._lock:
            if self._writing and not self._closed:
                self.con.execute(f"SET threads = {self._read_threads}")
                self._writing = False

    def release_memory(self) -> int:
        """Give back the blocks DuckDB keeps cached in memory (a quiet receiver: they only speed up reads
        that may not come for hours). Its ``memory_limit`` is lowered for a moment, which makes the buffer
        manager drop every block it can, and then set back. Writes wait; reads wait for the few
        milliseconds it takes, and nothing is done while a read runs. Returns the bytes given back
        (``duckdb_memory()`` before and after)."""
        if self._closed or not self._memory_limit:
            return 0
        with self.gate.rewriting(drain_seconds=0) as alone:
            if not alone:  # a read is running: it may need the memory; another quiet spell will come
                return 0
            with self._lock:
                if self._closed:
                    return 0
                con = self.con
                before = _buffer_bytes(con)
                try:
                    con.execute("SET memory_limit = '1MiB'")  # (lower, and setting it back can fail)
                except duckdb.Error:  # pinned blocks above the lower limit: what could go went
                    pass
                finally:
                    self._restore_memory_limit(con)
                return max(0, before - _buffer_bytes(con))

    def _restore_memory_limit(self, con: duckdb.DuckDBPyConnection) -> None:
        for attempt in range(3):
            try:
                con.execute(f"SET memory_limit = '{self._memory_limit}'")
                return
            except duckdb.Error:
                if attempt == 2:
                    raise
                time.sleep(0.01)

    def _insert(self, con: duckdb.DuckDBPyConnection, t: rows.Tables) -> WriteResult:
        out = WriteResult(duplicates=t.in_batch_duplicates - t.in_batch_conflicts, conflicts=t.in_batch_conflicts,
                          conflict_example=t.conflict_example)
        spans, events, links, logs = t.spans, t.span_events, t.span_links, t.log_records
        span_hashes = log_hashes = None
        if spans.num_rows:
            con.register("_n_spans", spans.select(["trace_id", "span_id"]))
            span_hashes = _hashes(con, "_n_spans", _SPAN_KEY)
            maybe = self._span_keys.maybe_stored(span_hashes)
            if maybe.any():
                con.register("_n_spans", spans.select(["trace_id", "span_id"]).filter(pa.array(maybe)))
                dup = con.sql(
                    "SELECT n.trace_id || n.span_id FROM _n_spans n SEMI JOIN spans s "
                    "ON s.trace_id = n.trace_id AND s.span_id = n.span_id"
                ).to_arrow_table()
                if dup.num_rows:
                    keys = pa.chunked_array(dup.column(0).chunks).combine_chunks()
                    resent = pc.is_in(_key(spans, ["trace_id", "span_id"]), keys)
                    n = self._count_conflicts(con, spans.filter(resent), out)
                    out.duplicates += dup.num_rows - n
                    keep = pc.invert(resent)
                    spans = spans.filter(keep)
                    span_hashes = span_hashes[keep.to_numpy(zero_copy_only=False)]
                    if events.num_rows:
                        events = events.filter(pc.invert(pc.is_in(_key(events, ["trace_id", "span_id"]), keys)))
                    if links.num_rows:
                        links = links.filter(pc.invert(pc.is_in(_key(links, ["trace_id", "span_id"]), keys)))
            if spans.num_rows:
                con.register("_n_spans", spans)
                con.execute("INSERT INTO spans SELECT * FROM _n_spans")
            if events.num_rows:
                con.register("_n_events", events)
                con.execute("INSERT INTO span_events SELECT * FROM _n_events")
            if links.num_rows:
                con.register("_n_links", links)
                con.execute("INSERT INTO span_links SELECT * FROM _n_links")
            if spans.num_rows:
                s0, e0, l0 = self._rows
                ne, nl = events.num_rows, links.num_rows
                con.execute(
                    INDEX_ROW_SQL.format(ranges="?, ?, ?, ?, ?, ?")
                    + "FROM _n_spans WHERE run_id IS NOT NULL GROUP BY run_id, trace_id",
                    [s0, s0 + spans.num_rows - 1, e0 if ne else None, e0 + ne - 1 if ne else None,
                     l0 if nl else None, l0 + nl - 1 if nl else None],
                )
            out.spans_stored = spans.num_rows
        if logs.num_rows:
            con.register("_n_logs", logs.select(["log_id"]))
            log_hashes = _hashes(con, "_n_logs", "log_id")
            maybe = self._log_keys.maybe_stored(log_hashes)
            if maybe.any():
                con.register("_n_logs", logs.select(["log_id"]).filter(pa.array(maybe)))
                dup = con.sql(
                    "SELECT n.log_id FROM _n_logs n SEMI JOIN log_records s ON s.log_id = n.log_id"
                ).to_arrow_table()
                if dup.num_rows:
                    out.duplicates += dup.num_rows
                    keys = pa.chunked_array(dup.column(0).chunks).combine_chunks()
                    keep = pc.invert(pc.is_in(logs.column("log_id"), keys))
                    logs = logs.filter(keep)
                    log_hashes = log_hashes[keep.to_numpy(zero_copy_only=False)]
            if logs.num_rows:
                con.register("_n_logs", logs)
                con.execute("INSERT INTO log_records SELECT * FROM _n_logs")
            out.logs_stored = logs.num_rows
        out.span_hashes, out.log_hashes = span_hashes, log_hashes
        res = t.resources
        if res.num_rows and (out.spans_stored or out.logs_stored):
            con.register("_n_res", res)
            new_res = con.sql(
                "SELECT * FROM _n_res n WHERE NOT EXISTS "
                "(SELECT 1 FROM resources r WHERE r.resource_id = n.resource_id)"
            ).to_arrow_table()
            if new_res.num_rows:
                con.register("_n_res", new_res)
                con.execute("INSERT INTO resources SELECT * FROM _n_res")
            res = new_res
        else:
            res = rows.SCHEMAS["resources"].empty_table()
        out.tables = {
            "spans": spans,
            "span_events": events,
            "span_links": links,
            "log_records": logs,
            "resources": res.cast(rows.SCHEMAS["resources"]) if res.num_rows else res,
        }
        return out

    @staticmethod
    def _count_conflicts(con: duckdb.DuckDBPyConnection, resent: pa.Table, out: WriteResult) -> int:
        """Of the re-sent spans, count (into ``out``, and return) those whose content differs from the stored span."""
        con.register("_n_resent", resent)
        try:
            found = con.sql(
                "SELECT count(*), any_value(n.trace_id || '/' || n.span_id) FROM _n_resent n JOIN spans s "
                f"ON s.trace_id = n.trace_id AND s.span_id = n.span_id WHERE {_SPAN_DIFFERS}"
            ).fetchall()[0]
        finally:
            con.unregister("_n_resent")
        out.conflicts += int(found[0])
        out.conflict_example = out.conflict_example or found[1]
        return int(found[0])

    def _row_counts(self) -> list[int]:
        """Rows in spans, span_events, span_links: the rowid of the next row appended to each."""
        return list(self.con.sql(
            "SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM span_events), (SELECT count(*) FROM span_links)"
        ).fetchall()[0])

    def _abort(self, exc: BaseException) -> None:
        """After a failed write: end its transaction, keeping ``exc`` as the error the caller sees.

        A failed commit (disk full, I/O error) has already ended the transaction, so ``rollback``
        then fails with "no transaction is active": that says nothing about the cause and is only
        logged. A database DuckDB invalidated after a fatal error is opened again, so writes work
        once the cause is gone, without a restart."""
        try:
            self.con.rollback()
        except duckdb.Error as rb:
            log.debug("rollback after a failed write: %s (the write failed with: %s)", rb, exc)
        if self.path and "invalidated" in str(exc).lower():
            self._reopen()
        self._reload_filters()

    def _reopen(self) -> None:
        try:
            self.con.close()
        except duckdb.Error:
            pass
        try:
            self.con = duckdb.connect(self.path or ":memory:", config=self._config)
            self.generation += 1
            self._writing = False
            self._checkpoint_at_once = False
            log.warning("reopened %s after a fatal write error", self.path)
        except duckdb.Error as exc:
            log.error("cannot reopen %s after a fatal write error: %s", self.path, exc)

    def _reload_filters(self) -> None:
        """After a failed write: the filters may list keys that were rolled back; rebuild them (still exact
        either way, a stale filter only sends more keys to the semi-join)."""
        try:
            self._span_keys = KeyFilter(self.con, "spans", _SPAN_KEY)
            self._log_keys = KeyFilter(self.con, "log_records", "log_id")
            self._rows = self._row_counts()
        except Exception:  # noqa: BLE001 - the connection itself failed; the next write reports it
            pass

    def exclusive(self, fn: Callable[[str], T]) -> T:
        """Run ``fn(path)`` with the file closed and every write waiting, then open it again: how an
        erasure or retention rewrites the file of a running receiver. Writes block for as long as ``fn``
        runs (the receiver keeps accepting requests into its WAL meanwhile); reads wait for it
        (``store/rewrite_gate.py``: bounded, then ``StoreBusy``), and the reads already running get
        ``READ_DRAIN_SECONDS`` to finish first."""
        if not self.path:
            raise ValueError("an in-memory store has no file to rewrite")
        with self.gate.rewriting():
            with self._lock:
                self.con.close()
                try:
                    return fn(self.path)
                finally:
                    self.con = duckdb.connect(self.path, config=self._config)
                    self.generation += 1
                    self._writing = False
                    self._checkpoint_at_once = False
                    self._reload_filters()

    # -- reads on the writer's database (same process) ------------------------------------------
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor on this database: reads see committed data while the writer keeps writing."""
        return self.con.cursor()

    def reader(self) -> Any:
        """A ``Reader`` over this store's database (same process: the receiver's reads, the console, tests,
        OTLP files); it waits for a rewrite and reads the file opened after it."""
        return StoreReader(self)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with self._lock:
                self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
