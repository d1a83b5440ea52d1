"""Read a tape store wherever it is: a DuckDB file, a Parquet lake folder, a running server, or memory.

Every reader answers ``query(sql, params) -> pyarrow.Table`` over the same table and view names.
DuckDB lets one process write a file; when ``agenttape serve`` holds it, the reader finds the server
through the discovery file ``<db>.serve.json`` ({"url", "pid", "token"}) and sends the query to its
``POST /api/query`` endpoint (JSON in, Arrow IPC stream out). Local readers open DuckDB with external
access disabled and the configuration locked, so a query can only read the store itself.
"""

from __future__ import annotations

import glob
import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc

from otel_agenttape.store import schema, views

ARROW_STREAM = "application/vnd.apache.arrow.stream"


class StoreError(Exception):
    """A store cannot be opened or a query failed; the message is meant for the user."""


class QueryError(StoreError):
    """The query itself was refused or failed."""


class StoreOpenError(StoreError, OSError):
    """DuckDB could not open a store file (in use, not a database, missing folder, ...).

    Also an ``OSError``: callers that report unreadable files already report this one.
    """


_LOCK_PID = re.compile(r"\bPID (\d+)")
_ERROR_KIND = re.compile(r"^[A-Za-z ]*Error: ")


def is_lock_error(exc: BaseException) -> bool:
    """DuckDB refused the file because another process holds its lock (not a broken or missing file)."""
    return "could not set lock" in str(exc).lower()


def lock_holder_pid(exc: BaseException) -> int | None:
    """The pid DuckDB names as holding the lock, when it names one."""
    m = _LOCK_PID.search(str(exc))
    return int(m.group(1)) if m else None


def open_error_message(path: str, exc: BaseException) -> str:
    """One line for the user: who holds a locked file, or DuckDB's own reason the file cannot be opened."""
    if is_lock_error(exc):
        pid = lock_holder_pid(exc)
        return f"{path} is in use by another process" + (f" (pid {pid})" if pid else "")
    text = _ERROR_KIND.sub("", str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    return f"cannot open {path}: {text}"


def discovery_path(db_path: str | os.PathLike[str]) -> Path:
    """Where a running server announces itself for a DuckDB file: ``<db>.serve.json`` (the receiver writes
    it, readers follow it to the server)."""
    return Path(f"{os.fspath(db_path)}.serve.json")


class Reader:
    """Common interface: ``query`` returns an Arrow table; ``close`` releases the source."""

    description: str = ""
    kind: str = ""

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        raise NotImplementedError

    def close(self) -> None:
        """Release the source."""

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ConnectionReader(Reader):
    """A reader over a DuckDB connection (a read-only file, a lake, or a writer's cursor)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, description: str = "", kind: str = "duckdb",
                 owns: bool = True, registered: dict[str, Any] | None = None) -> None:
        self.con = con
        # objects registered on ``con`` (Arrow datasets of an object-store lake): a cursor does not see
        # another connection's registrations, so ``new_cursor`` registers them again
        self.registered = dict(registered or {})
        self.description = description
        self.kind = kind
        self._owns = owns
        self._cursor_lock = threading.Lock()

    def new_cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own on the same database: one query on it blocks no other (``sql.py``
        runs each user query on one, inside a transaction it rolls back)."""
        with self._cursor_lock:
            cur = self.con.cursor()
        for name, obj in self.registered.items():
            cur.register(name, obj)
        return cur

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        try:
            return self.con.sql(sql, params=list(params) if params else None).to_arrow_table()
        except duckdb.Error as exc:
            raise QueryError(str(exc)) from exc

    def close(self) -> None:
        if self._owns:
            self.con.close()


class HttpReader(Reader):
    """Queries a running ``agenttape serve`` through ``POST /api/query``."""

    kind = "server"

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0, description: str = "") -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.description = description or self.url

    def query(self, sql: str, params: Sequence[Any] | None = None, timeout: float | None = None) -> pa.Table:
        """Run ``sql`` on the server; ``timeout`` (seconds) asks it to stop the query sooner than its own limit."""
        doc: dict[str, Any] = {"sql": sql, "params": list(params) if params else []}
        if timeout:
            doc["timeout"] = float(timeout)
        body = json.dumps(doc, default=str).encode()
        req = urllib.request.Request(
            self.url + "/api/query",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Accept": ARROW_STREAM},
        )
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            wait = self.timeout if not timeout else max(self.timeout, float(timeout) + 10.0)
            with urllib.request.urlopen(req, timeout=wait) as resp:
                data = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except (ValueError, AttributeError):
                pass
            if exc.code == 401:
                raise StoreError(f"the server at {self.url} refused the token (401): {detail}") from exc
            raise QueryError(detail.strip() or f"HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise StoreError(f"cannot reach the running server at {self.url}: {exc}") from exc
        with ipc.open_stream(pa.BufferReader(data)) as stream:
            return stream.read_all()


def _lake_files(root: str, table: str) -> list[str]:
    return sorted(glob.glob(os.path.join(root, table, "**", "*.parquet"), recursive=True))


LAKE_FOLDERS = (*schema.TABLES, "run_traces")  # run_traces: the lake's run index (parquet.RUN_TRACES)


def is_lake(path: str) -> bool:
    """A folder holding ``spans/``, any other store table folder, or ``run_traces/`` (all an export of
    an empty store writes), or a published lake's ``_manifest/``; or an ``s3://`` lake."""
    if path.startswith("s3://"):
        return True
    return os.path.isdir(path) and any(os.path.isdir(os.path.join(path, t)) for t in (*LAKE_FOLDERS, "_manifest"))


def open_lake(root: str | Sequence[str]) -> ConnectionReader:
    """An in-memory DuckDB with one view per table over the lake's Parquet files, plus the store views.

    A published lake (a folder with ``_manifest/``, or ``s3://bucket/prefix``) is read through its
    manifest, and a list of lakes and DuckDB files is read as one store (``store/lake/read.py``);
    a plain exported folder is read by its layout."""
    from otel_agenttape.store.lake import is_lake_uri, open_sources

    if not isinstance(root, (str, os.PathLike)):
        return open_sources(list(root))
    if is_lake_uri(os.fspath(root)):
        return open_sources([os.fspath(root)])
    root = os.path.abspath(root)
    con = duckdb.connect(":memory:")
    for table in schema.TABLES:
        files = _lake_files(root, table)
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
    if src.startswith("s3://") or os.path.isdir(os.path.join(src, "_manifest")):
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
