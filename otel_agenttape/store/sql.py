"""Run a user's SQL against a store without letting it change the store, reach files, or run forever.

Independent guards, each enough on its own for the cases it covers:

1. the text must be exactly one ``SELECT`` (or an ``EXPLAIN [ANALYZE]`` of one), checked with
   DuckDB's own parser and tokenizer rather than regular expressions;
2. the statement's physical plan (``EXPLAIN (FORMAT JSON)``) may hold only read operators and
   read-only table functions: a ``WITH x AS (DELETE ... RETURNING *) SELECT ...`` parses as a
   ``SELECT`` but plans a ``DELETE``, and ``SELECT * FROM checkpoint()`` plans a checkpoint;
3. the query runs on a cursor of its own inside a transaction that is always rolled back, so
   whatever slipped past 1 and 2 is never committed (a local file is also opened read-only);
4. every store database runs with ``enable_external_access = false`` and ``lock_configuration = true``,
   so ``read_text``, ``read_csv``, ``glob`` on paths, ``ATTACH``, ``COPY`` and extension loading
   fail inside the engine, and no setting can be turned back on.

A query that runs past its timeout is interrupted (``DuckDBPyConnection.interrupt``), which stops
its CPU use at once, and fails with ``QueryTimeout``.
"""

from __future__ import annotations

import contextlib

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from otel_agenttape.store.reader import ConnectionReader, HttpReader, QueryError, Reader

DEFAULT_QUERY_TIMEOUT = 30.0  # seconds; ``agenttape serve --query-timeout``, ``agenttape sql --timeout``

_ALLOWED = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}

# Physical operators that only read (names as DuckDB prints them in a plan).
_READ_OPERATORS = frozenset({
    "TABLE_SCAN", "SEQ_SCAN", "INDEX_SCAN", "DUMMY_SCAN", "CHUNK_SCAN", "COLUMN_DATA_SCAN",
    "DELIM_SCAN", "EXPRESSION_SCAN", "POSITIONAL_SCAN", "CTE_SCAN", "REC_CTE_SCAN", "REC_KEY_CTE_SCAN",
    "RECURSIVE_CTE_SCAN", "EMPTY_RESULT", "ORDER_BY", "LIMIT", "LIMIT_PERCENT", "STREAMING_LIMIT", "TOP_N",
    "RESERVOIR_SAMPLE", "STREAMING_SAMPLE", "WINDOW", "STREAMING_WINDOW", "UNNEST", "UNGROUPED_AGGREGATE",
    "HASH_GROUP_BY", "PERFECT_HASH_GROUP_BY", "PARTITIONED_AGGREGATE", "FILTER", "PROJECTION", "DELIM_JOIN",
    "LEFT_DELIM_JOIN", "RIGHT_DELIM_JOIN", "BLOCKWISE_NL_JOIN", "NESTED_LOOP_JOIN", "HASH_JOIN", "INDEX_JOIN",
    "PIECEWISE_MERGE_JOIN", "IE_JOIN", "ASOF_JOIN", "CROSS_PRODUCT", "POSITIONAL_JOIN", "UNION", "CTE",
    "REC_CTE", "REC_KEY_CTE", "RECURSIVE_CTE", "RECURSIVE_KEY_CTE", "INOUT_FUNCTION", "PIVOT",
    "RESULT_COLLECTOR",
})

# Table functions that only read the store. Anything else (checkpoint, force_checkpoint,
# truncate_duckdb_logs, register_external_resource, read_text, read_blob, glob, ...) is refused even
# though it parses as a SELECT: with external access off DuckDB still lets a database read its own
# file, and read_blob would hand out its raw bytes. Only the Parquet readers stay, for a lake's views
# (built on read_parquet); external access is off, so they reach nothing but the lake's own files.
_READ_TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree", "summary",
    "test_all_types", "pg_timezone_names", "icu_calendar_names", "duckdb_columns", "duckdb_constraints",
    "duckdb_databases", "duckdb_dependencies", "duckdb_functions", "duckdb_indexes", "duckdb_keywords",
    "duckdb_schemas", "duckdb_sequences", "duckdb_tables", "duckdb_types", "duckdb_views", "duckdb_memory",
    "pragma_table_info", "pragma_storage_info", "pragma_database_size", "pragma_version", "pragma_show",
    "pragma_collations", "pragma_metadata_info", "read_parquet", "parquet_scan", "read_single_parquet_file",
    "parquet_metadata", "parquet_schema", "parquet_file_metadata", "parquet_kv_metadata", "seq_scan",
})


class QueryTimeout(QueryError):
    """The query ran past its timeout and was interrupted."""


_parser_lock = threading.Lock()
_parser_con: duckdb.DuckDBPyConnection | None = None


def _parser() -> duckdb.DuckDBPyConnection:
    """One empty in-memory database for parsing (opening one costs more than the parse); hold ``_parser_lock``."""
    global _parser_con
    if _parser_con is None:
        _parser_con = duckdb.connect(":memory:", config={"enable_external_access": False, "lock_configuration": True})
    return _parser_con


def _one_statement(parser: duckdb.DuckDBPyConnection, sql: str) -> Any:
    try:
        statements = parser.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the query: {exc}") from exc
    if len(statements) != 1:
        raise QueryError(f"one statement per query, got {len(statements)}")
    return statements[0]


def _kind(stmt: Any) -> Any:
    try:
        return stmt.type
    except ValueError:  # a statement type this duckdb module has no name for (e.g. UPDATE EXTENSIONS)
        raise QueryError("read-only: this kind of statement is refused (only SELECT queries run here)") from None


def _explained(sql: str) -> tuple[str, bool]:
    """The statement an ``EXPLAIN [ANALYZE] [(options)]`` explains, and whether it would run it."""
    tokens = [(pos, kind) for pos, kind in duckdb.tokenize(sql) if kind != duckdb.token_type.comment]

    def text(i: int) -> str:
        start = tokens[i][0]
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(sql)
        return sql[start:end].strip()

    if not tokens or text(0).upper() != "EXPLAIN":
        raise QueryError("cannot find the statement this EXPLAIN explains")
    i, analyze = 1, False
    if i < len(tokens) and text(i).upper() in ("ANALYZE", "ANALYSE"):
        analyze, i = True, i + 1
    if i < len(tokens) and text(i) == "(":
        depth = 0
        while i < len(tokens):
            word = text(i).upper()
            depth += word == "("
            depth -= word == ")"
            analyze = analyze or word in ("ANALYZE", "ANALYSE")
            i += 1
            if depth == 0:
                break
    if i >= len(tokens):
        raise QueryError("EXPLAIN without a statement")
    return sql[tokens[i][0]:], analyze


def check_readonly(sql: str) -> str:
    """Raise ``QueryError`` unless ``sql`` is exactly one read-only statement; returns the ``SELECT``
    whose plan must be checked (the statement itself, or the one an ``EXPLAIN`` explains)."""
    if not sql or not sql.strip():
        raise QueryError("empty query")
    with _parser_lock:
        parser = _parser()
        stmt = _one_statement(parser, sql)
        kind = _kind(stmt)
        if kind not in _ALLOWED:
            name = getattr(kind, "name", str(kind))
            raise QueryError(f"read-only: {name} statements are refused (only SELECT queries run here)")
        if kind == duckdb.StatementType.EXPLAIN:
            inner, _ = _explained(sql)
            inner_kind = _kind(_one_statement(parser, inner))
            if inner_kind != duckdb.StatementType.SELECT:
                name = getattr(inner_kind, "name", str(inner_kind))
                raise QueryError(f"read-only: EXPLAIN {name} is refused (only SELECT queries run here)")
            return inner
        return sql


def _plan_nodes(plan: Any) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    stack = list(plan) if isinstance(plan, list) else [plan]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        extra = node.get("extra_info") or {}
        fn = extra.get("Function") if isinstance(extra, dict) else None
        out.append((str(node.get("name", "")).strip(), fn if isinstance(fn, str) else None))
        stack.extend(node.get("children") or [])
    return out


# Scans of the Arrow datasets an object-store lake registers on its connection (``ConnectionReader.registered``):
# allowed only on such a reader, where every table is one of them.
_REGISTERED_SCANS = frozenset({"python_arrow_scan", "arrow_scan", "arrow_scan_dumb"})


def check_plan(con: duckdb.DuckDBPyConnection, select_sql: str, params: Sequence[Any] | None = None,
               registered_scans: bool = False) -> None:
    """Raise ``QueryError`` when the plan of ``select_sql`` holds anything but reads (scans of registered
    Arrow datasets count as reads only with ``registered_scans``)."""
    try:
        rows = con.sql("EXPLAIN (FORMAT JSON) " + select_sql, params=list(params) if params else None).fetchall()
    except duckdb.Error as exc:  # the caret context would point into our EXPLAIN prefix: drop it
        if "read-only mode" in str(exc):  # a file opened read-only refuses to plan a write at all
            raise QueryError("read-only: the query would write to the store (only reads run here)") from exc
        raise QueryError(str(exc).split("\n\nLINE ", 1)[0]) from exc
    for _, text in rows:
        try:
            plan = json.loads(text)
        except ValueError as exc:
            raise QueryError(f"cannot read the query plan: {exc}") from exc
        for name, fn in _plan_nodes(plan):
            if fn is not None:
                if fn.lower() not in _READ_TABLE_FUNCTIONS and not (registered_scans and fn.lower() in _REGISTERED_SCANS):
                    raise QueryError(f"read-only: the table function {fn.lower()}() is refused here")
            elif name.upper() not in _READ_OPERATORS:
                raise QueryError(f"read-only: the query would run {name} (only reads run here)")


def _ensure_locked(con: duckdb.DuckDBPyConnection) -> None:
    found = con.sql(
        "SELECT current_setting('enable_external_access'), current_setting('lock_configuration')"
    ).fetchall()
    row = found[0] if found else None
    if not row or row[0] or not row[1]:
        raise QueryError("refusing to run user SQL on a connection that can reach files or change settings")


def _run_guarded(reader: ConnectionReader, sql: str, select_sql: str, params: Sequence[Any] | None,
                 timeout: float | None, relations: Mapping[str, pa.Table] | None = None) -> pa.Table:
    """Plan check, then the query on its own cursor in a transaction that is rolled back (inside the
    reader's ``reading()``: a store being rewritten waits for it, and it for the rewrite)."""
    reading = getattr(reader, "reading", None)
    with reading() if reading is not None else contextlib.nullcontext():
        return _run_on_cursor(reader, sql, select_sql, params, timeout, relations)


def _run_on_cursor(reader: ConnectionReader, sql: str, select_sql: str, params: Sequence[Any] | None,
                   timeout: float | None, relations: Mapping[str, pa.Table] | None) -> pa.Table:
    cur = reader.new_cursor()
    timer: threading.Timer | None = None
    fired = threading.Event()
    try:
        _ensure_locked(cur)
        for name, table in (relations or {}).items():  # in-memory Arrow tables, seen by this cursor only
            cur.register(name, table)
        cur.begin()
        check_plan(cur, select_sql, params, registered_scans=bool(reader.registered or relations))
        if timeout and timeout > 0:
            def stop() -> None:
                fired.set()
                cur.interrupt()

            timer = threading.Timer(timeout, stop)
            timer.daemon = True
            timer.start()
        try:
            return cur.sql(sql, params=list(params) if params else None).to_arrow_table()
        except duckdb.Error as exc:
            if fired.is_set() or isinstance(exc, duckdb.InterruptException):
                raise QueryTimeout(f"query interrupted after its {timeout:g} s timeout") from exc
            raise QueryError(str(exc)) from exc
    finally:
        if timer is not None:
            timer.cancel()
        try:
            cur.rollback()
        except duckdb.Error:
            pass  # no transaction left (the query failed before BEGIN, or DuckDB ended it)
        cur.close()


def run_readonly_sql(reader: Reader, sql: str, params: Sequence[Any] | None = None,
                     timeout: float | None = DEFAULT_QUERY_TIMEOUT,
                     relations: Mapping[str, pa.Table] | None = None) -> pa.Table:
    """Run one read-only query and return its rows; ``QueryError`` with a clear message otherwise,
    ``QueryTimeout`` when it ran past ``timeout`` seconds (None or 0: no limit). ``relations`` are
    Arrow tables the query may read by name besides the store's (computed by the caller, e.g. prices)."""
    select_sql = check_readonly(sql)
    if isinstance(reader, ConnectionReader):
        return _run_guarded(reader, sql, select_sql, params, timeout, relations)
    if isinstance(reader, HttpReader):  # the server applies every guard again, with its own limit
        if relations:
            raise QueryError(f"{', '.join(sorted(relations))}: computed where the store is read; query the "
                             "store or lake itself, not a server")
        return reader.query(sql, params, timeout=timeout)
    raise QueryError(f"refusing to run user SQL on a {type(reader).__name__}: no read-only guard for it")
