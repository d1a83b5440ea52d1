"""Reads of a store whose file a running receiver rewrites (an erasure, retention): they wait, not fail.

``Store.exclusive`` closes the database, has the file rewritten and opens it again. A cursor of the
closed database is dead, so a read would fail in the middle of it. ``RewriteGate`` orders them: a read
(``reading()``) waits while a rewrite is under way, up to ``READ_WAIT_SECONDS``, and then raises
``StoreBusy`` (``/api/query`` answers 503 with Retry-After); a rewrite (``rewriting()``) first stops new
reads, then lets the reads already running finish, up to ``READ_DRAIN_SECONDS`` (past that it goes on
and such a read fails; its client retries). Writes are not held here: the store's own lock holds them.

``StoreReader`` is the reader over the writer's database (``Store.reader()``): each query runs inside
the gate on a cursor of the database open now, so a reader the console keeps for hours works across
rewrites, and its ``generation`` (bumped by each rewrite) tells the read model's caches
(``tape/read/kept.store_version``) that the rows they hold may have changed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import duckdb
import pyarrow as pa

from otel_agenttape.store.readers import ConnectionReader, QueryError, Reader, StoreError

READ_WAIT_SECONDS = 50.0  # inside the 60 s a CLI's HttpReader waits for an answer
READ_DRAIN_SECONDS = 30.0


class StoreBusy(StoreError):
    """The store file is being rewritten for longer than a read may wait; retry later."""

    retry_after = 5.0


class RewriteGate:
    """Readers share the store; a rewrite has it alone (see the module doc)."""

    def __init__(self, wait_seconds: float = READ_WAIT_SECONDS, drain_seconds: float = READ_DRAIN_SECONDS) -> None:
        self.wait_seconds = wait_seconds
        self.drain_seconds = drain_seconds
        self._cond = threading.Condition()
        self._readers = 0
        self._rewriting = False
        self._local = threading.local()  # reads nested in one thread pass (a query inside a read)
        self.waited_reads = 0  # reads that waited for a rewrite (for tests and /metrics)
        self._last_read = time.monotonic()  # when the last read ended (``last_read``)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            with self._cond:
                if self._rewriting:
                    self.waited_reads += 1
                    if not self._cond.wait_for(lambda: not self._rewriting, self.wait_seconds):
                        raise StoreBusy(f"the store file is being rewritten (an erasure or retention) for more than "
                                        f"{self.wait_seconds:g} s; retry in a few seconds")
                self._readers += 1
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._cond:
                    self._readers -= 1
                    self._last_read = time.monotonic()
                    self._cond.notify_all()

    def last_read(self) -> float:
        """``time.monotonic()`` when the last read ended; now while one runs (how long reads were quiet)."""
        with self._cond:
            return time.monotonic() if self._readers else self._last_read

    @contextlib.contextmanager
    def rewriting(self, drain_seconds: float | None = None) -> Iterator[bool]:
        """Hold new reads back and wait for the running ones (bounded: ``drain_seconds``, by default the
        gate's); yields whether they all ended."""
        with self._cond:
            self._cond.wait_for(lambda: not self._rewriting)  # one rewrite at a time
            self._rewriting = True
            drained = self._cond.wait_for(lambda: self._readers == 0,
                                          self.drain_seconds if drain_seconds is None else drain_seconds)
        try:
            yield drained
        finally:
            with self._cond:
                self._rewriting = False
                self._cond.notify_all()


class StoreReader(ConnectionReader):
    """A reader over a ``Store``'s own database that outlives its rewrites (see the module doc)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._gen = -1
        self._cur: duckdb.DuckDBPyConnection | None = None
        self._closed = False
        super().__init__(None, description=store.path or ":memory:")  # type: ignore[arg-type]

    @property
    def generation(self) -> int:
        return int(self._store.generation)

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """A cursor of the database open now (a new one after each rewrite; waits for one under way)."""
        with self._store.gate.reading(), self._cursor_lock:
            if self._closed:
                raise StoreError("this reader is closed")
            gen = self._store.generation
            if self._cur is None or gen != self._gen:
                self._cur = self._store.con.cursor()
                self._gen = gen
            return self._cur

    @con.setter
    def con(self, value: Any) -> None:  # ConnectionReader.__init__ sets it; the store's cursor is taken instead
        pass

    def reading(self) -> Any:
        return self._store.gate.reading()

    def new_cursor(self) -> duckdb.DuckDBPyConnection:
        with self._store.gate.reading():
            return self._store.con.cursor()

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        with self._store.gate.reading():
            try:
                return self.con.sql(sql, params=list(params) if params else None).to_arrow_table()
            except duckdb.Error as exc:
                raise QueryError(str(exc)) from exc

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """On a cursor of its own, under the gate (a rewrite waits for it)."""
        with self._store.gate.reading():
            return ConnectionReader.rows(self, sql, params)

    def query_batches(self, sql: str, params: Sequence[Any] | None = None, rows: int = 65536
                      ) -> Iterator[pa.RecordBatch]:
        """Read whole under the gate, then handed out in batches: a stream left open would hold a
        rewrite back for as long as its consumer takes."""
        yield from self.query(sql, params).to_batches(max_chunksize=rows)

    def submit(self, sql: str, params: Sequence[Any] | None = None) -> Future[pa.Table]:
        """Run here, under the gate (``Reader.submit``): a cursor's query in another thread would not
        hold a rewrite back."""
        return Reader.submit(self, sql, params)

    def submit_rows(self, sql: str, params: Sequence[Any] | None = None) -> Future[list[dict[str, Any]]]:
        """Run here, under the gate, as ``submit``."""
        return Reader.submit_rows(self, sql, params)

    def close(self) -> None:
        with self._cursor_lock:
            self._closed = True
            cur, self._cur = self._cur, None
        if cur is not None:
            try:
                cur.close()
            except duckdb.Error:
                pass
