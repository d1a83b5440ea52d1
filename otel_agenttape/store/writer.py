"""The single writer of a DuckDB tape store.

One process owns a DuckDB file (DuckDB allows one writing process). Each batch is converted to Arrow
(``rows.py``), checked against stored keys with one semi-join, and inserted in one transaction, so a
re-sent span (same trace id + span id) or log record (same ``log_id``) is stored once. Keys are
checked with a hash semi-join on the new batch rather than a PRIMARY KEY index: an ART index over
random hex ids makes every insert slower and keeps growing in memory (see ``bench/store_size.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from otel_agenttape.store import rows, schema, views


@dataclass
class WriteResult:
    """What one write stored. ``tables`` holds exactly the rows inserted (for the Parquet sink)."""

    spans_stored: int = 0
    duplicates: int = 0
    logs_stored: int = 0
    tables: dict[str, pa.Table] = field(default_factory=dict, repr=False)


def locked_config(threads: int | None = None) -> dict[str, Any]:
    """DuckDB settings for every store database: no file/network access beyond the database itself,
    no extension loading, settings frozen. Queries served from this database (``/api/query``) then
    cannot reach the file system even if a statement check were bypassed."""
    config: dict[str, Any] = {
        "enable_external_access": False,
        "autoload_known_extensions": False,
        "autoinstall_known_extensions": False,
        "lock_configuration": True,
        # zstd over FSST/dictionary for stored columns: about half the bytes per GenAI span, and
        # no slower to checkpoint (bench/store_size.py)
        "force_compression": "zstd",
    }
    if threads:
        config["threads"] = int(threads)
    return config


def create_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the tables (if missing) and (re)create the views."""
    for name in schema.TABLES:
        con.execute(schema.table_ddl(name))
    views.create_views(con)


def _key(table: pa.Table, cols: list[str]) -> pa.Array:
    if len(cols) == 1:
        return table.column(cols[0])
    return pc.binary_join_element_wise(*[table.column(c) for c in cols], "")


class Store:
    """A DuckDB tape store. ``Store(None)`` is in memory (tests, OTLP files)."""

    def __init__(self, path: str | None = None, *, threads: int | None = None) -> None:
        self.path = path
        self.con = duckdb.connect(path or ":memory:", config=locked_config(threads))
        self._lock = threading.Lock()
        create_schema(self.con)
        self._closed = False

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
            con.begin()
            try:
                result = self._insert(con, t)
                con.commit()
            except BaseException:
                con.rollback()
                raise
            finally:
                for name in ("_n_spans", "_n_events", "_n_links", "_n_logs", "_n_res"):
                    try:
                        con.unregister(name)
                    except Exception:  # noqa: BLE001 - not registered in this batch
                        pass
        return result

    def _insert(self, con: duckdb.DuckDBPyConnection, t: rows.Tables) -> WriteResult:
        out = WriteResult(duplicates=t.in_batch_duplicates)
        spans, events, links, logs = t.spans, t.span_events, t.span_links, t.log_records
        if spans.num_rows:
            con.register("_n_spans", spans.select(["trace_id", "span_id"]))
            dup = con.sql(
                "SELECT n.trace_id || n.span_id FROM _n_spans n SEMI JOIN spans s "
                "ON s.trace_id = n.trace_id AND s.span_id = n.span_id"
            ).to_arrow_table()
            dup_keys = dup.column(0) if dup.num_rows else None
            if dup_keys is not None:
                out.duplicates += dup.num_rows
                keys = pa.chunked_array(dup_keys.chunks).combine_chunks()
                spans = spans.filter(pc.invert(pc.is_in(_key(spans, ["trace_id", "span_id"]), keys)))
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
            out.spans_stored = spans.num_rows
        if logs.num_rows:
            con.register("_n_logs", logs.select(["log_id"]))
            dup = con.sql(
                "SELECT n.log_id FROM _n_logs n SEMI JOIN log_records s ON s.log_id = n.log_id"
            ).to_arrow_table()
            if dup.num_rows:
                out.duplicates += dup.num_rows
                keys = pa.chunked_array(dup.column(0).chunks).combine_chunks()
                logs = logs.filter(pc.invert(pc.is_in(logs.column("log_id"), keys)))
            if logs.num_rows:
                con.register("_n_logs", logs)
                con.execute("INSERT INTO log_records SELECT * FROM _n_logs")
            out.logs_stored = logs.num_rows
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

    # -- reads on the writer's database (same process) ------------------------------------------
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new cursor on this database: reads see committed data while the writer keeps writing."""
        return self.con.cursor()

    def reader(self) -> Any:
        """A ``Reader`` over this store's database (same process, for tests and OTLP files)."""
        from otel_agenttape.store.reader import ConnectionReader

        return ConnectionReader(self.con.cursor(), description=self.path or ":memory:")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with self._lock:
                self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
