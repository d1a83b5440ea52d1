"""Run a user's SQL against a store without letting it write or reach files and the network.

Two independent guards: the statement must parse as exactly one ``SELECT`` (or ``EXPLAIN``), checked
with DuckDB's own parser rather than regular expressions; and every local reader's DuckDB runs with
``enable_external_access = false`` and ``lock_configuration = true``, so functions such as
``read_text``, ``read_csv`` or ``read_parquet`` on paths, ``ATTACH``, ``COPY`` and extension loading
fail inside the engine even if a statement slipped through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from otel_agenttape.store.reader import ConnectionReader, QueryError, Reader

_ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


def check_readonly(sql: str) -> None:
    """Raise ``QueryError`` unless ``sql`` is exactly one read-only statement."""
    if not sql or not sql.strip():
        raise QueryError("empty query")
    parser = duckdb.connect(":memory:")
    try:
        try:
            statements = parser.extract_statements(sql)
        except duckdb.Error as exc:
            raise QueryError(f"cannot parse the query: {exc}") from exc
    finally:
        parser.close()
    if len(statements) != 1:
        raise QueryError(f"one statement per query, got {len(statements)}")
    kind = statements[0].type
    if kind not in _ALLOWED:
        name = getattr(kind, "name", str(kind))
        raise QueryError(f"read-only: {name} statements are refused (only SELECT queries run here)")


def _ensure_locked(reader: Reader) -> None:
    if isinstance(reader, ConnectionReader):
        found = reader.con.sql(
            "SELECT current_setting('enable_external_access'), current_setting('lock_configuration')"
        ).fetchall()
        row = found[0] if found else None
        if not row or row[0] or not row[1]:
            raise QueryError("refusing to run user SQL on a connection that can reach files or change settings")


def run_readonly_sql(reader: Reader, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
    """Run one read-only query and return its rows; ``QueryError`` with a clear message otherwise."""
    check_readonly(sql)
    _ensure_locked(reader)
    return reader.query(sql, params)
