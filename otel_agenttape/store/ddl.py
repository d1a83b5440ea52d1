"""The store's tables, the writer's ``run_index`` and the views: created when missing, the views
replaced only when they differ, so opening a store that needs nothing writes nothing."""

from __future__ import annotations

import duckdb

from otel_agenttape.store import schema, views

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
  last_link_row BIGINT
)"""


def create_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the tables and the writer's ``run_index`` when missing, and the views when they differ."""
    for name in schema.TABLES:
        con.execute(schema.table_ddl(name))
    had_index = con.sql(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'run_index' AND schema_name = 'main'"
    ).fetchall()[0][0]
    con.execute(_RUN_INDEX_DDL)
    if not had_index:  # a store written before run_index existed: index what it holds (whole tables)
        con.execute(
            "INSERT INTO run_index SELECT run_id, min(start_time_unix_nano), max(end_time_unix_nano), count(*), "
            "min(rowid), max(rowid), (SELECT min(rowid) FROM span_events), (SELECT max(rowid) FROM span_events), "
            "(SELECT min(rowid) FROM span_links), (SELECT max(rowid) FROM span_links) "
            "FROM spans WHERE run_id IS NOT NULL GROUP BY run_id"
        )
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
