"""Read a tape store wherever it is: a DuckDB file, a Parquet lake folder, a running server, or memory.

Every reader answers ``query(sql, params) -> pyarrow.Table`` over the same table and view names.
DuckDB lets one process write a file; when ``agenttape serve`` holds it, the reader finds the server
through the discovery file ``<db>.serve.json`` ({"url", "pid", "token"}) and sends the query to its
``POST /api/query`` endpoint (JSON in, Arrow IPC stream out). Local readers open DuckDB with external
access disabled and the configuration locked, so a query can only read the store itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import duckdb

from otel_agenttape.store import schema, views
from otel_agenttape.store.readers import (
    ARROW_STREAM,
    ConnectionReader,
    HttpReader,
    QueryError,
    Reader,
    StoreError,
    StoreOpenError,
    lake_table_files,
    discovery_path,
    is_lake,
    is_lock_error,
    lock_holder_pid,
    open_error_message,
)


def open_lake(root: str | Sequence[str]) -> ConnectionReader:
    """An in-memory DuckDB with one view per table over the lake's Parquet files, plus the store views.

    A published lake (a folder with ``_manifest/``, or ``s3://bucket/prefix``) is read through its
    manifest, and a list of lakes and DuckDB files is read as one store (``store/lake/read.py``);
    a plain exported folder is read by its layout."""
    from otel_agenttape.store.lake import is_lake_uri, open_sources
    from otel_agenttape.store.lake.iceberg_catalog import is_iceberg_uri

    if not isinstance(root, (str, os.PathLike)):
        return open_sources(list(root))
    if is_lake_uri(os.fspath(root)) or is_iceberg_uri(os.fspath(root)):
        return open_sources([os.fspath(root)])
    root = os.path.abspath(root)
    con = duckdb.connect(":memory:")
    for table in schema.TABLES:
        files = lake_table_files(root, table)
        if not files:
            con.execute(schema.table_ddl(table))
            continue
        pattern = os.path.join(root, table, "**", "*.parquet").replace("'", "''")
        cols = ", ".join(schema.column_names(table))
        if any(c == "date" for c in schema.column_names(table)):
            src = (
                f"read_parquet('{pattern}', hive_partitioning = true, hive_types = {{'date': DATE}}, "
                f"union_by_name = true)"
            )
        else:
            src = f"read_parquet('{pattern}', union_by_name = true)"
        con.execute(f"CREATE VIEW {table} AS SELECT {cols} FROM {src}")
    views.create_views(con)
    con.execute(f"SET allowed_directories = ['{root.replace(chr(39), chr(39) * 2)}/']")
    con.execute("SET enable_external_access = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")
    return ConnectionReader(con, description=root, kind="lake")


def _read_discovery(db_path: str) -> dict[str, Any] | None:
    path = discovery_path(db_path)
    try:
        with open(path, encoding="utf-8") as fh:
            info = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StoreError(f"unreadable server discovery file {path}: {exc}") from exc
    if not isinstance(info, dict) or not info.get("url"):
        raise StoreError(f"server discovery file {path} has no url")
    return info


def open_duckdb(db_path: str) -> Reader:
    """Read-only DuckDB reader; through the running server when the file is locked by it."""
    if not os.path.exists(db_path):
        raise StoreError(f"no tape store at {db_path} (run `agenttape serve --db {db_path}` or `agenttape demo`)")
    try:
        con = duckdb.connect(
            db_path,
            read_only=True,
            config={
                "enable_external_access": False,
                "autoload_known_extensions": False,
                "autoinstall_known_extensions": False,
                "lock_configuration": True,
            },
        )
    except duckdb.Error as exc:
        # held by another process (a lock) or by a writer in this one (a connection with other settings)
        if not (is_lock_error(exc) or isinstance(exc, duckdb.ConnectionException)):
            raise StoreOpenError(open_error_message(db_path, exc)) from exc
        info = _read_discovery(db_path)
        if info is None:
            pid = lock_holder_pid(exc)
            raise StoreOpenError(
                f"{db_path} is locked by another process{f' (pid {pid})' if pid else ''} and no running server "
                f"announces it ({discovery_path(db_path)} missing): stop that process or read a copy of the file"
            ) from exc
        return HttpReader(str(info["url"]), token=info.get("token"), description=f"{db_path} via {info['url']}")
    return ConnectionReader(con, description=db_path, kind="duckdb")


def open_reader(source: Any) -> Reader:
    """Open a reader on a DuckDB file, a Parquet lake folder, a ``Store`` (in memory), or a server URL."""
    from otel_agenttape.store.writer import Store

    if isinstance(source, Reader):
        return source
    if isinstance(source, Store):
        return source.reader()
    if isinstance(source, (list, tuple)):
        return open_lake(source)
    src = os.fspath(source)
    if src.startswith(("http://", "https://")):
        return HttpReader(src)
    if src.startswith(("s3://", "iceberg+")) or os.path.isdir(os.path.join(src, "_manifest")):
        return open_lake(src)
    if os.path.isdir(src):
        if not is_lake(src):
            raise StoreError(f"{src} is a folder but not a Parquet lake (no spans/, run_traces/ or other table folders)")
        return open_lake(src)
    return open_duckdb(src)


__all__ = [
    "ARROW_STREAM",
    "ConnectionReader",
    "HttpReader",
    "QueryError",
    "Reader",
    "StoreError",
    "StoreOpenError",
    "discovery_path",
    "is_lake",
    "is_lock_error",
    "open_duckdb",
    "open_error_message",
    "open_lake",
    "open_reader",
]
