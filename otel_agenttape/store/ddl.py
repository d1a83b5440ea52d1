"""The store's tables, the writer's ``run_index`` and the views: created when missing, the views
replaced only when they differ, so opening a store that needs nothing writes nothing."""

from __future__ import annotations

import hashlib
from typing import Any

import duckdb

from otel_agenttape.store import schema, views
from otel_agenttape.store.runs_view import OURS_ROLE

# One row per run, trace and write. The run and trace are kept as their keys only (below): the ids
# are read from the spans, at the rows these ranges point to, when a page or a run needs them.
_RUN_INDEX_COLUMNS = {
    "run_hash": "UBIGINT NOT NULL", "trace_hash": "UBIGINT NOT NULL",
    "start_time_unix_nano": "BIGINT NOT NULL", "end_time_unix_nano": "BIGINT NOT NULL", "spans": "BIGINT NOT NULL",
    "first_span_row": "BIGINT NOT NULL", "last_span_row": "BIGINT NOT NULL",
    "first_event_row": "BIGINT", "last_event_row": "BIGINT", "first_link_row": "BIGINT", "last_link_row": "BIGINT",
    "run_start_unix_nano": "BIGINT", "last_start_unix_nano": "BIGINT",
}
_RUN_INDEX_DDL = ("CREATE TABLE IF NOT EXISTS run_index (\n  "
                  + ",\n  ".join(f"{c} {t}" for c, t in _RUN_INDEX_COLUMNS.items()) + "\n)")
# A run's key: ``run_hash`` and ``trace_hash``, the first 8 bytes of the MD5 digests of its run id and
# of its trace id, read little-endian (DuckDB's ``md5_number_upper``). Runs are grouped and counted by
# the pair without reading their ids; a run is looked up by ``run_hash`` and its rows then read by run
# id, so a run id sharing the hash of another only widens the rows read. Sixteen bytes where the ids
# took about 55 (a lake's ``run_traces`` holds the ids too, and the same keys).
RUN_KEY_SQL = "md5_number_upper(run_id) AS run_hash, md5_number_upper(trace_id) AS trace_hash"
RUN_HASH_OF_PARAM = "run_hash = md5_number_upper(?)"  # ``WHERE`` a run id given as a parameter


def run_hash_where(run_id: str) -> tuple[str, list[Any]]:
    """``WHERE`` a run's key, and its parameter: the key worked out here (``run_hash``, the value of
    ``md5_number_upper``; a lookup then compares numbers, 0.2 ms less on a million-span store), or by
    DuckDB for a run id UTF-8 cannot hold (DuckDB refuses it as it always did)."""
    key = run_hash(run_id)
    return ("run_hash = ?", [key]) if key is not None else (RUN_HASH_OF_PARAM, [run_id])


def run_hash(run_id: str) -> int | None:
    """DuckDB's ``md5_number_upper(run_id)``: the first 8 bytes of the MD5 digest of its UTF-8, read
    little-endian; None for text UTF-8 cannot hold."""
    try:
        data = run_id.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return int.from_bytes(hashlib.md5(data, usedforsecurity=False).digest()[:8], "little")


# The index row of the spans of one run and trace in a write (in a ``GROUP BY run_id, trace_id``); the
# row ranges are parameters.
INDEX_ROW_SQL = (
    f"INSERT INTO run_index ({', '.join(_RUN_INDEX_COLUMNS)}) SELECT {RUN_KEY_SQL}, "
    "min(start_time_unix_nano), max(end_time_unix_nano), count(*), {ranges}, "
    f"min(start_time_unix_nano) FILTER (WHERE ({OURS_ROLE}) = 'run'), max(start_time_unix_nano) ")
# Every span with a run id, indexed per (run, trace) over whole tables (a store written before the
# index, or before its present columns: row ranges as wide as the tables).
_INDEX_ALL_SQL = INDEX_ROW_SQL.format(ranges=(
    "min(rowid), max(rowid), (SELECT min(rowid) FROM span_events), (SELECT max(rowid) FROM span_events), "
    "(SELECT min(rowid) FROM span_links), (SELECT max(rowid) FROM span_links)")) + (
    "FROM spans WHERE run_id IS NOT NULL GROUP BY run_id, trace_id")


def create_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the tables and the writer's ``run_index`` when missing, and the views when they differ."""
    for name in schema.TABLES:
        con.execute(schema.table_ddl(name))
    have = [str(r[0]) for r in con.sql(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'run_index' AND schema_name = 'main' "
        "ORDER BY column_index").fetchall()]
    if have != list(_RUN_INDEX_COLUMNS):  # none yet, or one of an earlier layout: index what the store holds
        con.execute("BEGIN")
        try:
            if have:
                con.execute("DROP TABLE run_index")
            con.execute(_RUN_INDEX_DDL)
            con.execute(_INDEX_ALL_SQL)
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    if _view_sql(con) != _expected_view_sql():
        views.create_views(con)


_VIEW_SQL = "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' ORDER BY 1"
_expected_views: list[tuple[str, str]] | None = None


def _view_sql(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    return [(str(n), str(q)) for n, q in con.sql(_VIEW_SQL).fetchall()]


def _expected_view_sql() -> list[tuple[str, str]]:
    """The views as DuckDB stores them once created (its own rendering of the SQL), built once in
    memory: a store whose views already match is not written to when it opens, so a server that
    stores nothing leaves the file as it found it."""
    global _expected_views
    if _expected_views is None:
        mem = duckdb.connect(":memory:")
        try:
            for name in schema.TABLES:
                mem.execute(schema.table_ddl(name))
            mem.execute(_RUN_INDEX_DDL)
            views.create_views(mem)
            _expected_views = _view_sql(mem)
        finally:
            mem.close()
    return _expected_views
