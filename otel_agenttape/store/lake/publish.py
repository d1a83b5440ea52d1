"""A receiver publishes its DuckDB store into the lake: immutable Parquet files plus one manifest entry
per batch, on a cadence (rows or time).

The DuckDB file stays the hot store and, with the OTLP write-ahead log in front of it, the durable
record: every table is append-only, so a row's ``rowid`` is its position and a batch is a rowid range
per table. The publication cursor lives in that same file (``lake_publications``):

1. the batch's ranges are committed there as ``pending`` with the next sequence number;
2. its files are written under names fixed by (receiver, seq, table, date):
   ``spans/date=2026-12-01/<receiver>-<seq:010d>.parquet``, each atomically;
3. the manifest entry ``_manifest/<receiver>/<seq:010d>.json`` is written (atomically);
4. the batch is marked ``published``.

A crash anywhere leaves at most one pending batch. On restart it is published again with the same
ranges and so the same file names: files already written are replaced by identical rows, and if the
entry was already written the batch is only marked. Nothing is lost and nothing is listed twice.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Any

from otel_agenttape.store import parquet as pqlake
from otel_agenttape.store.lake import manifest as mf
from otel_agenttape.store.lake.files import RUN_TRACES, write_or_skip
from otel_agenttape.store.lake.fs import LakeFS, lake_fs

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 60.0  # seconds between publications while rows arrive
DEFAULT_MAX_SPANS = 200_000  # a batch this large is published at once (and batches are capped to it)
TABLES = ("spans", "span_events", "span_links", "log_records", "resources")
_COLS = {"spans": "spans", "span_events": "events", "span_links": "links", "log_records": "logs",
         "resources": "resources"}
_BATCH_ROWS = 32 * 1024

PUBLICATIONS_DDL = """CREATE TABLE IF NOT EXISTS lake_publications (
  lake VARCHAR NOT NULL,
  receiver VARCHAR NOT NULL,
  seq BIGINT NOT NULL,
""" + "".join(f"  {c}_lo BIGINT NOT NULL,\n  {c}_hi BIGINT NOT NULL,\n" for c in _COLS.values()) + """  state VARCHAR NOT NULL,
  created_unix_nano BIGINT NOT NULL,
  published_unix_nano BIGINT
)"""


class ReceiverIdInUse(ValueError):
    """Another receiver already publishes under this id into this lake."""


@dataclass
class Batch:
    seq: int
    ranges: dict[str, tuple[int, int]]
    receiver: str = ""  # the id it was fixed under (a pending batch keeps it if the id changed since)

    @property
    def spans(self) -> int:
        lo, hi = self.ranges["spans"]
        return hi - lo

    @property
    def empty(self) -> bool:
        return all(hi <= lo for lo, hi in self.ranges.values())


class LakePublisher:
    """Publishes a ``Store``'s rows into a lake; ``start()`` runs the cadence in a thread."""

    def __init__(self, store: Any, lake: str | LakeFS, receiver_id: str, interval: float = DEFAULT_INTERVAL,
                 max_spans: int = DEFAULT_MAX_SPANS, level: int = pqlake.ZSTD_LEVEL_STREAM) -> None:
        self.store = store
        self.lake = lake if isinstance(lake, LakeFS) else lake_fs(lake, create=True)
        self.receiver = mf.check_receiver_id(receiver_id)
        self.interval = float(interval)
        self.max_spans = max(1, int(max_spans))
        self.level = level
        self.published_batches = 0
        self.published_files = 0
        self.failures = 0
        self.last_error: str | None = None
        self._lock = threading.RLock()  # one DuckDB cursor, used by the cadence and /metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = time.monotonic()
        self._left = {t: 0 for t in TABLES}
        self._con = store.cursor()
        self._con.execute(PUBLICATIONS_DDL)
        self._check_id()
        path = getattr(store, "path", None)
        if not self.lake.local and path and path != ":memory:":
            self.lake.staging = f"{path}.lake-staging"  # beside the store: cleared after a crash
        left = self.lake.clear_staged(f"{self.receiver}-", own=mf.entry_key(self.receiver, 0).rsplit("/", 1)[0])
        if left:
            log.info("removed %d staged lake file(s) a stopped receiver %s left", left, self.receiver)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Publish nothing meanwhile (the store file is rewritten, or the lake erased, by the receiver that
        runs this publisher); its cursor on the store is renewed after, since a rewrite closes it."""
        with self._lock:
            try:
                yield
            finally:
                self._con = self.store.cursor()

    # -- cursor -------------------------------------------------------------------------------
    def _rows(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._con.execute(sql, params).fetchall()

    def _check_id(self) -> None:
        mine = self._rows("SELECT max(seq) FROM lake_publications WHERE lake = ? AND receiver = ?",
                          [self.lake.uri, self.receiver])[0][0]
        seen = mf.load_catalog(self.lake).receivers().get(self.receiver)
        if seen is not None and (mine is None or seen > mine):
            raise ReceiverIdInUse(
                f"receiver id {self.receiver!r} already publishes into {self.lake.uri} (batch {seen}, this store "
                f"published {'none' if mine is None else mine}): give each receiver its own --receiver-id")

    def _pending(self) -> Batch | None:
        cols = ", ".join(f"{c}_lo, {c}_hi" for c in _COLS.values())
        found = self._rows(f"SELECT seq, {cols}, receiver FROM lake_publications WHERE lake = ? "
                           "AND state = 'pending' ORDER BY created_unix_nano LIMIT 1", [self.lake.uri])
        if not found:
            return None
        r = found[0]
        return Batch(int(r[0]), {t: (int(r[1 + 2 * i]), int(r[2 + 2 * i])) for i, t in enumerate(TABLES)},
                     str(r[-1]))

    def unpublished(self) -> dict[str, int]:
        """Rows of each table not yet in a batch (pending or published)."""
        with self._lock:
            los = self._cursor_los()
            counts = self._counts()
        return {t: max(0, counts[t] - los[t]) for t in TABLES}

    def _cursor_los(self) -> dict[str, int]:
        cols = ", ".join(f"coalesce(max({c}_hi), 0)" for c in _COLS.values())
        r = self._rows(f"SELECT {cols} FROM lake_publications WHERE lake = ?", [self.lake.uri])[0]
        return {t: int(r[i]) for i, t in enumerate(TABLES)}

    def _counts(self) -> dict[str, int]:
        r = self._rows("SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES), [])[0]
        return {t: int(r[i]) for i, t in enumerate(TABLES)}

    def _new_batch(self) -> Batch | None:
        los = self._cursor_los()
        counts = self._counts()
        ranges = {t: (los[t], max(los[t], counts[t])) for t in TABLES}
        lo, hi = ranges["spans"]
        ranges["spans"] = (lo, min(hi, lo + self.max_spans))
        batch = Batch(0, ranges, self.receiver)
        if batch.empty:
            return None
        seq = self._rows("SELECT coalesce(max(seq), 0) + 1 FROM lake_publications WHERE lake = ? AND receiver = ?",
                         [self.lake.uri, self.receiver])[0][0]
        batch.seq = int(seq)
        flat = [v for t in TABLES for v in ranges[t]]
        self._con.execute(
            f"INSERT INTO lake_publications VALUES (?, ?, ?, {', '.join('?' * len(flat))}, 'pending', ?, NULL)",
            [self.lake.uri, self.receiver, batch.seq, *flat, time.time_ns()])
        return batch

    # -- publication --------------------------------------------------------------------------
    def publish_once(self) -> Batch | None:
        """Publish the pending batch if there is one, else a new batch of what is unpublished."""
        with self._lock:
            batch = self._pending() or self._new_batch()
            if batch is None:
                return None
            self._publish(batch)
            self._last = time.monotonic()
            return batch

    def publish_all(self) -> int:
        """Publish until nothing is left; returns the batches published."""
        n = 0
        while self.publish_once() is not None:
            n += 1
        return n

    def _publish(self, batch: Batch) -> None:
        key = mf.entry_key(batch.receiver, batch.seq)
        if not self.lake.exists(key) and batch.seq > mf.latest_covers(self.lake).get(batch.receiver, 0):
            files = self._write_files(batch)
            entry = {"format": mf.FORMAT, "receiver": batch.receiver, "seq": batch.seq, "created": mf.now_iso(),
                     "ranges": {t: list(r) for t, r in batch.ranges.items()}, "files": files}
            self.lake.put_bytes(key, mf.dumps(entry))
            self.published_files += len(files)
        self._con.execute("UPDATE lake_publications SET state = 'published', published_unix_nano = ? "
                          "WHERE lake = ? AND receiver = ? AND seq = ?",
                          [time.time_ns(), self.lake.uri, batch.receiver, batch.seq])
        self.published_batches += 1

    @staticmethod
    def _name(batch: Batch) -> str:
        return f"{batch.receiver}-{batch.seq:010d}.parquet"

    def _stream(self, sql: str, params: list[Any]) -> Any:
        reader = self._con.sql(sql, params=params).to_arrow_reader(_BATCH_ROWS)
        yield from reader

    def _write_files(self, batch: Batch) -> list[dict[str, Any]]:
        files: list[dict[str, Any]] = []
        name = self._name(batch)
        for table in TABLES:
            lo, hi = batch.ranges[table]
            if hi <= lo:
                continue
            where = "rowid >= ? AND rowid < ?"
            if table not in pqlake.PARTITIONED:
                rec = write_or_skip(self.lake, f"{table}/{name}", table, self._stream(
                    f"SELECT * FROM {table} WHERE {where} ORDER BY resource_id", [lo, hi]), self.level)
                files.extend([rec] if rec else [])
                continue
            days = [r[0] for r in self._rows(f"SELECT DISTINCT date FROM {table} WHERE {where} ORDER BY 1", [lo, hi])]
            order = ", ".join(pqlake.SORT_KEYS[table])
            for day in days:
                rec = write_or_skip(self.lake, f"{table}/date={day.isoformat()}/{name}", table, self._stream(
                    f"SELECT * FROM {table} WHERE {where} AND date = ? ORDER BY {order}", [lo, hi, day]), self.level)
                if rec:
                    rec["date"] = day.isoformat()
                    files.append(rec)
        lo, hi = batch.ranges["spans"]
        if hi > lo:
            sql = pqlake.RUN_TRACES_SQL.replace(
                "FROM spans WHERE run_id IS NOT NULL OR parent_run_id IS NOT NULL",
                "FROM spans WHERE rowid >= ? AND rowid < ? AND (run_id IS NOT NULL OR parent_run_id IS NOT NULL)")
            rec = write_or_skip(self.lake, f"{RUN_TRACES}/{name}", RUN_TRACES, self._stream(sql, [lo, hi]), self.level)
            files.extend([rec] if rec else [])
        return files

    # -- cadence ------------------------------------------------------------------------------
    def due(self) -> bool:
        pending = self.unpublished()
        if pending["spans"] >= self.max_spans:
            return True
        return any(pending.values()) and time.monotonic() - self._last >= self.interval

    def _loop(self) -> None:
        tick = max(0.05, min(1.0, self.interval / 4))
        while not self._stop.wait(tick):
            try:
                if self._pending() is not None or self.due():
                    self.publish_once()
                    self.last_error = None
            except Exception as exc:  # noqa: BLE001 - the lake may be down: the rows stay in DuckDB
                self.failures += 1
                self.last_error = str(exc)
                log.warning("lake publication to %s failed (rows stay in the hot store, retried): %s",
                            self.lake.uri, exc)
                self._stop.wait(min(30.0, tick * 4))

    def start(self) -> LakePublisher:
        """Publish what an earlier process left pending, then run the cadence in a thread; rows the
        store already held are due at its first tick (not an interval later: a store opened by a new
        receiver, or one that stopped before it published, would wait that long for its lake)."""
        try:
            while self._pending() is not None:
                self.publish_once()
        except Exception as exc:  # noqa: BLE001 - the thread retries
            self.failures += 1
            self.last_error = str(exc)
            log.warning("lake publication to %s failed at start (retried): %s", self.lake.uri, exc)
        try:
            if any(self.unpublished().values()):
                self._last = float("-inf")
        except Exception as exc:  # noqa: BLE001 - then they wait for the interval
            log.debug("could not count the rows left to publish: %s", exc)
        self._thread = threading.Thread(target=self._loop, name="agenttape-lake", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush: bool = True) -> None:
        """Stop the cadence; with ``flush`` publish everything the store holds first."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        if flush:
            try:
                self.publish_all()
            except Exception as exc:  # noqa: BLE001 - published at the next start instead
                self.failures += 1
                log.warning("lake publication at shutdown failed (published at the next start): %s", exc)
        try:
            self._con.close()
        except Exception:  # noqa: BLE001, S110
            pass

    def gauges(self) -> dict[str, tuple[str, int]]:
        """Prometheus gauges for the receiver's /metrics."""
        left = self._left
        if self._lock.acquire(blocking=False):  # a publication in progress: the last count
            try:
                left = self._left = self.unpublished()
            except Exception:  # noqa: BLE001, S110 - the store is closing
                pass
            finally:
                self._lock.release()
        return {
            "agenttape_lake_published_batches": ("Batches this receiver published into the lake since start.",
                                                 self.published_batches),
            "agenttape_lake_published_files": ("Parquet files this receiver published since start.",
                                               self.published_files),
            "agenttape_lake_unpublished_spans": ("Spans in the hot store not yet published.", left["spans"]),
            "agenttape_lake_publish_failures": ("Failed publication attempts since start (retried).", self.failures),
        }
