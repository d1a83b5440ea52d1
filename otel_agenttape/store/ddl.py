"""The store's tables, the writer's ``run_index`` and the views: created when missing, the views
replaced only when they differ, so opening a store that needs nothing writes nothing."""

from __future__ import annotations

import duckdb

from otel_agenttape.store import schema, views
from otel_agenttape.store.runs_view import OURS_ROLE

_RUN_INDEX_DDL = """CREATE TABLE IF NOT EXISTS run_index (
  run_id VARCHAR NOT NULL,
  start_time_unix_nano BIGINT NOT NULL,
  end_time_unix_nano BIGINT NOT NULL,
  spans BIGINT NOT NULL,
  first_span_row BIGINT NOT NULL,
  last_span_row BIGINT NOT NULL,
  first_event_row BIGINT,
  last_event_row BIGINT,
  first_link_row BIGINT,
  last_link_row BIGINT,
  trace_id VARCHAR,
  run_start_unix_nano BIGINT,
  last_start_unix_nano BIGINT,
  run_key_hi UBIGINT,
  run_key_lo UBIGINT
)"""
# The columns a runs page is cut from (``tape/read/index_keys``): the run's trace, the start of its run
# span(s) in the write, the latest start of its spans in the write, and the run's key: the MD5 digest of
# ``run_id@trace_id`` as two numbers (its first and last 8 bytes read little-endian), so that runs are
# grouped and counted without reading their ids. A lake's ``run_traces`` holds the same columns.
_PAGE_COLUMNS = {"trace_id": "VARCHAR", "run_start_unix_nano": "BIGINT", "last_start_unix_nano": "BIGINT",
                 "run_key_hi": "UBIGINT", "run_key_lo": "UBIGINT"}
RUN_KEY_SQL = ("md5_number_upper(run_id || '@' || trace_id) AS run_key_hi, "
               "md5_number_lower(run_id || '@' || trace_id) AS run_key_lo")
# The page columns of the spans of one run and trace (in a GROUP BY run_id, trace_id).
PAGE_COLUMNS_SQL = (f"trace_id, min(start_time_unix_nano) FILTER (WHERE ({OURS_ROLE}) = 'run'), "
                    f"max(start_time_unix_nano), {RUN_KEY_SQL}")
# Every span with a run id, indexed per (run, trace) over whole tables (a store written before the index,
# or before its page columns: row ranges as wide as the tables).
_INDEX_ALL_SQL = (
    "INSERT INTO run_index SELECT run_id, min(start_time_unix_nano), max(end_time_unix_nano), count(*), "
    "min(rowid), max(rowid), (SELECT min(rowid) FROM span_events), (SELECT max(rowid) FROM span_events), "
    f"(SELECT min(rowid) FROM span_links), (SELECT max(rowid) FROM span_links), {PAGE_COLUMNS_SQL} "
    "FROM spans WHERE run_id IS NOT NULL GROUP BY run_id, trace_id")


def create_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the tables and the writer's ``run_index`` when missing, and the views when they differ."""
    for name in schema.TABLES:
        con.execute(schema.table_ddl(name))
    had_index = con.sql(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'run_index' AND schema_name = 'main'"
    ).fetchall()[0][0]
    con.execute(_RUN_INDEX_DDL)
    have = {str(r[0]) for r in con.sql(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'run_index' AND schema_name = 'main'").fetchall()}
    if had_index and not set(_PAGE_COLUMNS) <= have:  # written before the page columns: index again
        con.execute("BEGIN")
        try:
            for name, kind in _PAGE_COLUMNS.items():
                if name not in have:
                    con.execute(f"ALTER TABLE run_index ADD COLUMN {name} {kind}")
            con.execute("DELETE FROM run_index")
            con.execute(_INDEX_ALL_SQL)
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    elif not had_index:  # a store written before run_index existed: index what it holds
        con.execute(_INDEX_ALL_SQL)
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
