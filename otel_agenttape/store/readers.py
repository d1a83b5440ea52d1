"""What a reader is and how reading fails: the ``Reader`` interface, the reader over a DuckDB
connection (a read-only file, a lake, a writer's cursor) and the reader of a running server, the
store's error types, and which paths are lakes. ``store.reader`` opens the right one for a source;
the modules it opens through (``store.writer``, ``store.lake.read``) take these from here.
"""

from __future__ import annotations

import glob
import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc

from otel_agenttape.store import schema

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

    def query_batches(self, sql: str, params: Sequence[Any] | None = None, rows: int = 65536
                      ) -> Iterator[pa.RecordBatch]:
        """``query`` a batch of at most ``rows`` rows at a time (a reader that can stream does: a million
        rows are then never all in memory at once)."""
        yield from self.query(sql, params).to_batches(max_chunksize=rows)

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """A small result as one dict a row (a lookup's few rows): a reader that can skips the Arrow
        table in between. Scalar columns read as in ``query(...).to_pylist()``."""
        return self.query(sql, params).to_pylist()

    def submit(self, sql: str, params: Sequence[Any] | None = None) -> Future[pa.Table]:
        """``query`` started now, its table (or error) in the future returned: a reader that can run
        queries side by side does (a rebuild reads a trace's spans while its events are being read);
        this one runs it before returning."""
        fut: Future[pa.Table] = Future()
        try:
            fut.set_result(self.query(sql, params))
        except Exception as exc:  # noqa: BLE001 - handed to whoever asks for the result
            fut.set_exception(exc)
        return fut

    def submit_rows(self, sql: str, params: Sequence[Any] | None = None) -> Future[list[dict[str, Any]]]:
        """``rows`` started now, as ``submit`` starts ``query``: this one runs it before returning."""
        fut: Future[list[dict[str, Any]]] = Future()
        try:
            fut.set_result(self.rows(sql, params))
        except Exception as exc:  # noqa: BLE001 - handed to whoever asks for the result
            fut.set_exception(exc)
        return fut

    def close(self) -> None:
        """Release the source."""

    def reading(self) -> Any:
        """Held around a read made of several calls (a query on a cursor of its own): a store a running
        receiver rewrites waits for it, and it for the rewrite (``store/rewrite_gate.py``)."""
        import contextlib

        return contextlib.nullcontext()

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

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """Fetched as Python rows on a cursor of its own: DuckDB's relation and Arrow result (what
        ``query`` makes) cost about as much again as a lookup of a run on a million-span store
        (``bench/replay.py``: 1.1 ms against 2.0 for the run index, 2.4 against 3.0 for a trace's spans)."""
        if self.registered:
            return Reader.rows(self, sql, params)
        cur = self.new_cursor()
        try:
            cur.execute(sql, list(params) if params else None)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]
        except duckdb.Error as exc:
            raise QueryError(str(exc)) from exc
        finally:
            cur.close()

    def query_batches(self, sql: str, params: Sequence[Any] | None = None, rows: int = 65536
                      ) -> Iterator[pa.RecordBatch]:
        """Streamed from DuckDB on a cursor of its own (another query on this reader meanwhile does not
        end the stream)."""
        cur = self.new_cursor()
        try:
            try:
                stream = cur.sql(sql, params=list(params) if params else None).to_arrow_reader(rows)
                for rb in stream:
                    yield rb
            except duckdb.Error as exc:
                raise QueryError(str(exc)) from exc
        finally:
            cur.close()

    def submit(self, sql: str, params: Sequence[Any] | None = None) -> Future[pa.Table]:
        """Run on a cursor of its own in a reader thread (DuckDB lets go of the GIL while it runs): the
        caller goes on meanwhile. A lake with registered datasets runs it here (a cursor would register
        them again)."""
        if self.registered:
            return Reader.submit(self, sql, params)
        cur = self.new_cursor()

        def run() -> pa.Table:
            try:
                return cur.sql(sql, params=list(params) if params else None).to_arrow_table()
            except duckdb.Error as exc:
                raise QueryError(str(exc)) from exc
            finally:
                cur.close()

        return _read_pool().submit(run)

    def submit_rows(self, sql: str, params: Sequence[Any] | None = None) -> Future[list[dict[str, Any]]]:
        """``rows`` in a reader thread (the caller goes on meanwhile), without the Arrow table ``submit``
        makes: a rebuild's events are read this way while it reads the spans."""
        if self.registered:
            return Reader.submit_rows(self, sql, params)
        return _read_pool().submit(self.rows, sql, params)

    def close(self) -> None:
        if self._owns:
            self.con.close()


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _read_pool() -> ThreadPoolExecutor:
    """The threads ``ConnectionReader.submit`` runs queries on (made on first use, shared by readers)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="agenttape-read")
        return _POOL


def _forget_pool() -> None:
    """In a forked child the pool's threads are gone: the child makes its own on first use."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class HttpReader(Reader):
    """Queries a running ``agenttape serve`` through ``POST /api/query``."""

    kind = "server"

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0, description: str = "") -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.description = description or self.url
        self._settled = False

    def query(self, sql: str, params: Sequence[Any] | None = None, timeout: float | None = None) -> pa.Table:
        """Run ``sql`` on the server; ``timeout`` (seconds) asks it to stop the query sooner than its own limit.
        The first query asks the server to settle first: spans it acknowledged before (an export that
        just returned) are then in what this reader reads."""
        doc: dict[str, Any] = {"sql": sql, "params": list(params) if params else []}
        if timeout:
            doc["timeout"] = float(timeout)
        if not self._settled:
            doc["settle"] = True
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
        self._settled = True
        with ipc.open_stream(pa.BufferReader(data)) as stream:
            return stream.read_all()


def lake_table_files(root: str, table: str) -> list[str]:
    """The Parquet files of one table of an exported lake folder, in name order."""
    return sorted(glob.glob(os.path.join(root, table, "**", "*.parquet"), recursive=True))


LAKE_FOLDERS = (*schema.TABLES, "run_traces")  # run_traces: the lake's run index (parquet.RUN_TRACES)


def is_lake(path: str) -> bool:
    """A folder holding ``spans/``, any other store table folder, or ``run_traces/`` (all an export of
    an empty store writes), or a published lake's ``_manifest/``; or an ``s3://`` lake."""
    if path.startswith("s3://"):
        return True
    return os.path.isdir(path) and any(os.path.isdir(os.path.join(path, t)) for t in (*LAKE_FOLDERS, "_manifest"))
