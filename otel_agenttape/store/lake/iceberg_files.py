"""Data files of the Iceberg lake: written by us (the lake's writer options), committed through pyiceberg.

pyiceberg's own writer (``Table.append``) takes zstd and its level, page and row-group sizes from table
properties, but has no setting for column encodings, so it cannot write times as deltas
(``DELTA_BINARY_PACKED``), and it needs ``pyiceberg-core`` to bucket rows. So each file is written here
with ``parquet.writer_options`` (zstd, dictionaries, deltas), carries Iceberg field ids, and becomes an
Iceberg ``DataFile`` with pyiceberg's statistics from its footer and the partition we computed
(``add_files`` cannot infer a bucket partition from statistics). A commit is one snapshot per table;
its summary names the batch (``agenttape.batch``) and the sha256 of each file it added.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_agenttape.store import parquet as pqlake
from otel_agenttape.store.lake.files import size_and_hash
from otel_agenttape.store.lake.files import RUN_TRACES
from otel_agenttape.store.lake.fs import LakeError, LakeFS, lake_fs
from otel_agenttape.store.lake.iceberg_catalog import TRACE_BUCKETS, arrow_schema, conform

BATCH = "agenttape.batch"
HASHES = "agenttape.sha256"
COVERS = "agenttape.covers"
KIND = "agenttape.operation"
# on a run index snapshot: how many runs (distinct keys of run and trace) the table holds after it
RUNS = "agenttape.runs"
EPOCH = dt.date(1970, 1, 1)
COMMIT_ATTEMPTS = 60


def location_fs(location: str, staging: str | None = None) -> tuple[LakeFS, str]:
    """The file system of a table location (``file:///...`` or ``s3://...``) and the location as a base."""
    if location.startswith("file://"):
        fs = lake_fs(location[len("file://"):], create=True)
    elif location.startswith("/"):
        fs = lake_fs(location, create=True)
    elif location.startswith("s3://"):
        fs = lake_fs(location)
    else:
        raise LakeError(f"unsupported Iceberg table location {location}: a folder or s3://")
    fs.staging = staging
    return fs, location.rstrip("/")


def summary_props(snap: Any) -> dict[str, str]:
    return dict(getattr(snap.summary, "additional_properties", {}) or {}) if snap.summary is not None else {}


def buckets(trace_ids: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Iceberg's ``bucket(TRACE_BUCKETS, trace_id)`` of each row (murmur3 of the UTF-8 id), hashing each id once."""
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import StringType

    fn = BucketTransform(TRACE_BUCKETS).transform(StringType())
    uniq = pc.unique(trace_ids)
    vals = pa.array([None if v is None else fn(v) for v in uniq.to_pylist()], pa.int32())
    return pc.take(vals, pc.index_in(trace_ids, uniq))


def file_key(partition: tuple[Any, ...] | None, name: str) -> str:
    """The file's key under the table location: ``data/date_day=.../trace_id_bucket=N/NAME`` for dated tables."""
    if not partition:
        return f"data/{name}"
    day, bucket = partition
    d = "null" if day is None else (EPOCH + dt.timedelta(days=int(day))).isoformat()
    return f"data/date_day={d}/trace_id_bucket={'null' if bucket is None else bucket}/{name}"


def split(table: str, t: pa.Table, dated: bool) -> Iterable[tuple[tuple[Any, ...] | None, pa.Table]]:
    """Rows (already sorted) per partition: (day number, bucket) for dated tables, one part otherwise."""
    if not dated:
        yield None, t
        return
    b = buckets(t.column("trace_id"))
    days = pc.unique(t.column("date")).to_pylist()
    for day in sorted(days, key=lambda d: (d is None, d)):
        dmask = pc.is_null(t.column("date")) if day is None else pc.equal(t.column("date"), pa.scalar(day, pa.date32()))
        for bk in sorted(set(pc.filter(b, dmask).to_pylist()), key=lambda v: (v is None, v)):
            mask = pc.and_(dmask, pc.is_null(b) if bk is None else pc.equal(b, pa.scalar(bk, pa.int32())))
            part = t.filter(mask)
            if part.num_rows:
                yield (None if day is None else (day - EPOCH).days, bk), part


def write_data_file(tbl: Any, fs: LakeFS, key: str, table: str, t: pa.Table, partition: tuple[Any, ...] | None,
                    level: int = pqlake.ZSTD_LEVEL_STREAM) -> tuple[Any, str]:
    """Write ``t`` (store rows) as one Parquet file ``key`` under the table location, whole or not at all;
    returns its Iceberg ``DataFile`` and sha256."""
    return write_data_file_parts(tbl, fs, key, table, [t], partition, level)


def write_data_file_parts(tbl: Any, fs: LakeFS, key: str, table: str, parts: Iterable[pa.Table],
                          partition: tuple[Any, ...] | None, level: int = pqlake.ZSTD_LEVEL_STREAM) -> tuple[Any, str]:
    """``write_data_file`` from rows that come in parts (each written as it comes, then dropped: an erasure
    rewrites a data file a batch at a time); whole or not at all."""
    sch = arrow_schema(table)
    with fs.staged(key) as tmp:
        with pq.ParquetWriter(tmp, sch, **pqlake.writer_options(sch.names, level)) as w:
            for t in parts:
                w.write_table(conform(table, t), row_group_size=pqlake.ROW_GROUP_ROWS)
        md = pq.read_metadata(tmp)
        size, digest = size_and_hash(tmp)
    return data_file(tbl, fs.path(key) if fs.local else f"s3://{fs.path(key)}", md, size, partition), digest


def data_file(tbl: Any, path: str, md: Any, size: int, partition: tuple[Any, ...] | None) -> Any:
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    schema = tbl.schema()
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=md, stats_columns=compute_statistics_plan(schema, tbl.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema))
    if path.startswith("/"):
        path = "file://" + path
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
        partition=Record(*(partition or ())), file_size_in_bytes=size, sort_order_id=tbl.sort_order().order_id,
        spec_id=tbl.spec().spec_id, equality_ids=None, key_metadata=None, **stats.to_serialized_dict())


def _kept_covers(tbl: Any) -> dict[str, int]:
    """The coverage maintenance kept as a table property when it expired older snapshots."""
    return {r: int(s) for r, s in json.loads((tbl.properties or {}).get(COVERS, "{}")).items()}


def batch_committed(tbl: Any, receiver: str, seq: int) -> bool:
    """Is batch (receiver, seq) in this table: named by a snapshot's summary, or folded into the coverage a
    maintenance snapshot recorded (or kept as a table property when it expired older snapshots)."""
    want = f"{receiver}/{seq}"
    if _kept_covers(tbl).get(receiver, 0) >= seq:
        return True
    for snap in tbl.metadata.snapshots:
        props = summary_props(snap)
        if props.get(BATCH) == want:
            return True
        if COVERS in props and int(json.loads(props[COVERS]).get(receiver, 0)) >= seq:
            return True
    return False


def receiver_high(tbl: Any, receiver: str) -> int | None:
    """The highest batch of this receiver the table holds, or None."""
    out: int | None = _kept_covers(tbl).get(receiver)
    for snap in tbl.metadata.snapshots:
        props = summary_props(snap)
        b = props.get(BATCH, "")
        if b.rsplit("/", 1)[0] == receiver:
            out = max(out or 0, int(b.rsplit("/", 1)[1]))
        if COVERS in props and receiver in (c := json.loads(props[COVERS])):
            out = max(out or 0, int(c[receiver]))
    return out


def coverage(tbl: Any) -> dict[str, int]:
    """Receiver -> highest batch seq over every snapshot the table keeps (carried by maintenance)."""
    out: dict[str, int] = _kept_covers(tbl)
    for snap in tbl.metadata.snapshots:
        props = summary_props(snap)
        if b := props.get(BATCH):
            r, s = b.rsplit("/", 1)
            out[r] = max(out.get(r, 0), int(s))
        for r, s in json.loads(props.get(COVERS, "{}")).items():
            out[r] = max(out.get(r, 0), int(s))
    return out


def _retryable(exc: BaseException) -> bool:
    from pyiceberg.exceptions import CommitFailedException

    if isinstance(exc, CommitFailedException):
        return True
    text = str(exc).lower()
    # pyiceberg's own retry of a transaction rebuilds it on the snapshot it started from; when expiry
    # (``lake retain``/``compact`` with a short grace) removed that snapshot meanwhile it gives up with a
    # ValidationException before committing anything: refreshed, the change applies to the current snapshot
    if type(exc).__name__ == "ValidationException" and "cannot find starting snapshot" in text:
        return True
    return "database is locked" in text or "could not serialize" in text or "deadlock" in text


def commit(tbl: Any, work: Callable[[Any], None], already: Callable[[Any], bool] | None = None,
           on_retry: Callable[[], None] | None = None) -> bool:
    """Run ``work(transaction)`` and commit it; a conflict with another writer refreshes the table and retries
    (``already(tbl)`` says the change is in, e.g. a commit whose answer was lost; ``on_retry()`` is called
    for each retry, ours or the one pyiceberg's transaction makes itself). True when committed here."""
    from pyiceberg.exceptions import CommitStateUnknownException

    delay = 0.02
    for attempt in range(COMMIT_ATTEMPTS):
        if attempt:
            if on_retry is not None:
                on_retry()
            tbl.refresh()
        if already is not None and already(tbl):
            return False
        start = tbl.metadata.current_snapshot_id
        try:
            with tbl.transaction() as tx:
                work(tx)
            if on_retry is not None:  # pyiceberg rebased the snapshot on another writer's (its own retry)
                cur = tbl.metadata.current_snapshot()
                if cur is not None and cur.parent_snapshot_id != start:
                    on_retry()
            return True
        except CommitStateUnknownException:
            continue
        except Exception as exc:  # noqa: BLE001 - sorted by _retryable
            if not _retryable(exc):
                raise
        time.sleep(delay * (0.5 + random.random()))  # noqa: S311 - jitter, not security
        delay = min(1.0, delay * 1.6)
    raise LakeError(f"commit into {tbl.name()} kept conflicting with other writers ({COMMIT_ATTEMPTS} attempts)")


def append_files(tbl: Any, files: list[Any], props: dict[str, str], receiver: str, seq: int,
                 more: Callable[[Any], dict[str, str]] | None = None,
                 on_retry: Callable[[], None] | None = None) -> bool:
    """Append these data files as one snapshot carrying ``props`` (and ``more(tbl)``, computed on each
    attempt from the table as it is then), unless batch (receiver, seq) is there."""
    def work(tx: Any) -> None:
        summary = {**props, **(more(tbl) if more is not None else {})}
        with tx.update_snapshot(snapshot_properties=summary).fast_append() as fa:
            for f in files:
                fa.append_data_file(f)

    return commit(tbl, work, lambda t: batch_committed(t, receiver, seq), on_retry)


def index_keys(tbl: Any) -> pa.Table:
    """The keys (``run_hash``, ``trace_hash``) of every row of the run index's current snapshot that has
    them: two fixed-width columns of its live files."""
    import pyarrow.dataset as ds

    snap = tbl.current_snapshot()
    schema = index_keys_schema()
    if snap is None:
        return schema.empty_table()
    paths = [task.file.file_path for task in tbl.scan(snapshot_id=snap.snapshot_id).plan_files()]
    if not paths:
        return schema.empty_table()
    fs, _ = location_fs(tbl.location())
    keys = [p[len("file://"):] if p.startswith("file://") else p[len("s3://"):] if p.startswith("s3://") else p
            for p in paths]
    dataset = ds.dataset(keys, filesystem=fs.fs, format="parquet", schema=arrow_schema(RUN_TRACES))
    return dataset.to_table(columns=["run_hash", "trace_hash"], filter=pc.field("run_hash").is_valid())


def run_count(tbl: Any, added: pa.Table) -> dict[str, str]:
    """``RUNS`` for a snapshot that adds these index rows on top of the table's current one: the distinct
    keys of both, counted (the commit is accepted only on that snapshot, so the count is exact for it)."""
    new = conform(RUN_TRACES, added).select(["run_hash", "trace_hash"]).filter(pc.field("run_hash").is_valid())
    both = pa.concat_tables([index_keys(tbl).cast(index_keys_schema()), new.cast(index_keys_schema())])
    return {RUNS: str(both.group_by(["run_hash", "trace_hash"]).aggregate([]).num_rows)}


def index_keys_schema() -> pa.Schema:
    sch = arrow_schema(RUN_TRACES)
    return pa.schema([sch.field("run_hash"), sch.field("trace_hash")])
