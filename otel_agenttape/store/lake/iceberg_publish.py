"""A receiver publishes its DuckDB store into the Iceberg lake: one append snapshot per table per batch.

The cursor is the folder lake's (``publish.py``: ``lake_publications`` in the DuckDB file, a batch is a
rowid range per table, fixed as ``pending`` before anything is written). Then, table by table (the run
index last, so it never points at spans a reader cannot see yet):

1. the batch's rows are split by partition (day, trace-id bucket), sorted, and written as data files
   under names fixed by (receiver, seq, partition): ``data/date_day=.../trace_id_bucket=3/r1-0000000042.parquet``;
2. they are appended through the catalog as one snapshot whose summary says ``agenttape.batch = r1/42``;
   another receiver's commit in between is a conflict: the table is refreshed and the append retried.

A crash leaves at most the pending batch. On restart each table is checked for its batch id first: a
table that has it is skipped, the others get the same files rewritten (the same names and rows) and
appended. Files written but never committed are in no snapshot, so no reader (ours or another engine)
sees them; they are replaced by that rewrite, and staged uploads are cleared at start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from otel_agenttape.store import parquet as pqlake
from otel_agenttape.store.lake import iceberg_catalog as ic
from otel_agenttape.store.lake import iceberg_files as ifl
from otel_agenttape.store.lake import manifest as mf
from otel_agenttape.store.lake.files import RUN_TRACES
from otel_agenttape.store.lake.publish import DEFAULT_INTERVAL, DEFAULT_MAX_SPANS, PUBLICATIONS_DDL, TABLES, Batch
from otel_agenttape.store.lake.publish import LakePublisher, ReceiverIdInUse

log = logging.getLogger(__name__)

COMMIT_ORDER = ("resources", "span_links", "span_events", "log_records", "spans", RUN_TRACES)


class _Named:
    """What the shared cursor code needs of a lake: its URL (the key of ``lake_publications``)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri


class IcebergPublisher(LakePublisher):
    """Publishes a ``Store``'s rows into an Iceberg lake (``iceberg+sql:``, ``iceberg+postgresql:``, REST)."""

    def __init__(self, store: Any, lake: str, receiver_id: str, interval: float = DEFAULT_INTERVAL,
                 max_spans: int = DEFAULT_MAX_SPANS, level: int = pqlake.ZSTD_LEVEL_STREAM) -> None:
        self.store = store
        self.url = ic.parse_lake_url(lake)
        self.lake = _Named(lake)  # type: ignore[assignment]
        self.receiver = mf.check_receiver_id(receiver_id)
        self.interval = float(interval)
        self.max_spans = max(1, int(max_spans))
        self.level = level
        self.published_batches = 0
        self.published_files = 0
        self.failures = 0
        self.last_error: str | None = None
        self.commit_retries = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = time.monotonic()
        self._left = {t: 0 for t in TABLES}
        self._con = store.cursor()
        self._con.execute(PUBLICATIONS_DDL)
        self.catalog, _ = ic.load(self.url)
        self.tables = ic.ensure_tables(self.catalog, self.url.namespace)
        path = getattr(store, "path", None)
        self._staging = f"{path}.lake-staging" if path and path != ":memory:" else None
        self._fs = {t: ifl.location_fs(tbl.location(), self._staging) for t, tbl in self.tables.items()}
        adopted = self.adopt_migrated()
        if adopted:
            log.info("receiver %s continues after the %d batch(es) `lake migrate` brought into %s", self.receiver,
                     adopted, lake)
        self._check_id()
        gone = self.clean_orphans()
        if gone:
            log.info("removed %d file(s) a stopped receiver %s left uncommitted", gone, self.receiver)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Publish nothing meanwhile (the store file is rewritten, or the lake erased, by the receiver that
        runs this publisher); its cursor on the store is renewed after, since a rewrite closes it."""
        with self._lock:
            try:
                yield
            finally:
                self._con = self.store.cursor()

    def adopt_migrated(self) -> int:
        """A receiver that moves from a folder/S3 lake to this one after ``lake migrate`` copied that lake: its
        batches the migration brought in are published here too, so its cursor there (the same batches, the
        same row ranges) becomes its cursor here and it goes on with the next batch. Only once, before it
        has published anything here; returns how many batches were taken over."""
        from otel_agenttape.store.lake.iceberg_maintain import migrated_origins

        mine = self._rows("SELECT count(*) FROM lake_publications WHERE lake = ? AND receiver = ?",
                          [self.lake.uri, self.receiver])[0][0]
        if mine:
            return 0
        taken = 0
        for origin, covers in migrated_origins(self.tables["spans"]).items():
            upto = covers.get(self.receiver)
            if not upto:
                continue
            with self._lock:
                pending = self._con.execute(
                    "SELECT count(*) FROM lake_publications WHERE lake = ? AND receiver = ? AND seq <= ? "
                    "AND state <> 'published'", [origin, self.receiver, upto]).fetchall()[0][0]
                if pending:  # the old lake's cursor is not settled: nothing to take over safely
                    continue
                cols = [r[0] for r in self._con.execute("DESCRIBE lake_publications").fetchall()]
                rest = ", ".join(c for c in cols if c != "lake")
                self._con.execute(f"INSERT INTO lake_publications (lake, {rest}) SELECT ?, {rest} FROM "
                                  "lake_publications WHERE lake = ? AND receiver = ? AND seq <= ?",
                                  [self.lake.uri, origin, self.receiver, upto])
                taken = self._con.execute("SELECT count(*) FROM lake_publications WHERE lake = ? AND receiver = ?",
                                          [self.lake.uri, self.receiver]).fetchall()[0][0]
            if taken:
                break
        return int(taken)

    def _check_id(self) -> None:
        mine = self._rows("SELECT max(seq) FROM lake_publications WHERE lake = ? AND receiver = ?",
                          [self.lake.uri, self.receiver])[0][0]
        tbl = self.tables["spans"]
        seen = ifl.receiver_high(tbl, self.receiver)
        if seen is not None and (mine is None or seen > mine):
            raise ReceiverIdInUse(
                f"receiver id {self.receiver!r} already publishes into {self.lake.uri} (batch {seen}, this store "
                f"published {'none' if mine is None else mine}): give each receiver its own --receiver-id")

    def clean_orphans(self) -> int:
        """Delete what a killed publication left: staged uploads, and the pending batch's files in every table
        that did not commit it (they are written again, whole, when the batch is published)."""
        gone = 0
        fs0 = next(iter(self._fs.values()))[0]
        gone += fs0.clear_staged(f"{self.receiver}-")
        batch = self._pending()
        if batch is None:
            return gone
        name = self._name(batch)
        for table in COMMIT_ORDER:
            tbl = self.tables[table]
            if ifl.batch_committed(tbl, batch.receiver, batch.seq):
                continue
            fs, _ = self._fs[table]
            for key in fs.list("data"):
                if key.rsplit("/", 1)[-1] == name and fs.delete(key):
                    gone += 1
        return gone

    def _publish(self, batch: Batch) -> None:
        name = self._name(batch)
        summary_base = {ifl.BATCH: f"{batch.receiver}/{batch.seq}", ifl.KIND: "publish",
                        "agenttape.ranges": json.dumps({t: list(r) for t, r in batch.ranges.items()})}
        for table in COMMIT_ORDER:
            tbl = self.tables[table]
            if ifl.batch_committed(tbl, batch.receiver, batch.seq):
                continue
            files, hashes, rows = self._write(table, tbl, batch, name)
            if not files:
                continue
            props = {**summary_base, ifl.HASHES: json.dumps(hashes, sort_keys=True, separators=(",", ":"))}
            # the run index's snapshot records how many runs the table then holds: the first runs page's count
            more = (lambda t, rows=rows: ifl.run_count(t, rows)) if table == RUN_TRACES else None
            if ifl.append_files(tbl, files, props, batch.receiver, batch.seq, more, self._retried):
                self.published_files += len(files)
        self._con.execute("UPDATE lake_publications SET state = 'published', published_unix_nano = ? "
                          "WHERE lake = ? AND receiver = ? AND seq = ?",
                          [time.time_ns(), self.lake.uri, batch.receiver, batch.seq])
        self.published_batches += 1

    def _query(self, table: str, batch: Batch) -> Any:
        if table == RUN_TRACES:
            lo, hi = batch.ranges["spans"]
            if hi <= lo:
                return None
            sql = pqlake.RUN_TRACES_SQL.replace(
                "FROM spans WHERE run_id IS NOT NULL OR parent_run_id IS NOT NULL",
                "FROM spans WHERE rowid >= ? AND rowid < ? AND (run_id IS NOT NULL OR parent_run_id IS NOT NULL)")
            return self._con.sql(sql, params=[lo, hi]).to_arrow_table()
        lo, hi = batch.ranges[table]
        if hi <= lo:
            return None
        order = ", ".join(ic.SORT[table])
        return self._con.sql(f"SELECT * FROM {table} WHERE rowid >= ? AND rowid < ? ORDER BY {order}",
                             params=[lo, hi]).to_arrow_table()

    def _write(self, table: str, tbl: Any, batch: Batch, name: str) -> tuple[list[Any], dict[str, str], Any]:
        with self._lock:
            t = self._query(table, batch)
        if t is None or t.num_rows == 0:
            return [], {}, None
        fs, _ = self._fs[table]
        files: list[Any] = []
        hashes: dict[str, str] = {}
        for part, rows in ifl.split(table, t, table in pqlake.PARTITIONED):
            key = ifl.file_key(part, name)
            df, digest = ifl.write_data_file(tbl, fs, key, table, rows, part, self.level)
            files.append(df)
            hashes[key] = digest
        return files, hashes, t

    def _retried(self) -> None:
        self.commit_retries += 1

    def gauges(self) -> dict[str, tuple[str, int]]:
        return {**super().gauges(), "agenttape_lake_commit_retries": (
            "Iceberg commits retried after another writer committed first, since start.", self.commit_retries)}
