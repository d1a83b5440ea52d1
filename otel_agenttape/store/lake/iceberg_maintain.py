"""Maintaining the Iceberg lake, each change one Iceberg snapshot: migration from a folder/S3 lake, compaction,
retention, snapshot expiry.

- ``migrate(OLD, URL)`` copies every live file of a manifest lake into the Iceberg tables. The rows are
  rewritten, not added as they are (``add_files``): Iceberg needs each data file to lie in one partition of
  the table's spec, and a folder-lake file holds every trace-id bucket of its day. One snapshot per group of
  source files names them (``agenttape.migrated``), so a migration that stops is resumed by running it
  again and one that finished does nothing; it also records the old lake's receiver coverage (a receiver
  that then moves to the Iceberg lake takes over its cursor from the old lake, ``IcebergPublisher.
  adopt_migrated``, and publishes nothing twice) and its retention records (``verify`` keeps telling
  removed tape ranges from tampering).
- ``compact(URL)`` merges each partition's small files into one overwrite snapshot (``agenttape.operation =
  compact``, the sha256 of each new file, the paths it replaced). A receiver's append in between is a
  conflict: the table is refreshed and the merge committed again on top of it.
- ``retain(URL, days)`` deletes whole day partitions in one delete snapshot, recording per sealed tape the
  seq ranges that went (as the folder lake's retention does).
- Files replaced or deleted are removed from storage, and older snapshots expired, only ``grace_seconds``
  after (a reader that opened the previous snapshot still finds its files). Before snapshots expire, the
  receivers' batch coverage is kept as a table property, so a restarted receiver still finds its batch.

Run one maintainer per lake at a time (a cron job, a Kubernetes CronJob with ``concurrencyPolicy: Forbid``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections import defaultdict
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from otel_agenttape.store import parquet as pqlake
from otel_agenttape.store.lake import iceberg_catalog as ic
from otel_agenttape.store.lake import iceberg_files as ifl
from otel_agenttape.store.lake import manifest as mf
from otel_agenttape.store.lake.fs import LakeError, lake_fs
from otel_agenttape.store.lake.maintain import DEFAULT_GRACE_SECONDS, DEFAULT_TARGET_BYTES
from otel_agenttape.store.retention import cutoff as retention_cutoff
from otel_agenttape.store.retention import islands as _islands
from otel_agenttape.store.lake.read import scan_sql

MIGRATED = "agenttape.migrated"
REMOVED = "agenttape.removed"
RETENTION = "agenttape.retention"
MIGRATED_COVERS = "agenttape.migrated-covers"
MIGRATE_GROUP = 16  # source files per migration snapshot


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def migrated_keys(tbl: Any, origin: str) -> set[str]:
    """The source files of lake ``origin`` that migration snapshots of this table already hold."""
    out: set[str] = set()
    for snap in tbl.metadata.snapshots:
        rec = ifl.summary_props(snap).get(MIGRATED)
        if rec and (doc := json.loads(rec)).get("from") == origin:
            out.update(doc["keys"])
    out.update(json.loads(tbl.properties.get(MIGRATED, "{}")).get(origin, []))
    return out


def migrated_origins(tbl: Any) -> dict[str, dict[str, int]]:
    """Lake URI -> the receiver coverage (receiver -> highest batch) its migration into this table recorded."""
    out: dict[str, dict[str, int]] = {}
    for snap in tbl.metadata.snapshots:
        props = ifl.summary_props(snap)
        if rec := props.get(MIGRATED):
            origin = json.loads(rec)["from"]
            cov = out.setdefault(origin, {})
            for r, seq in json.loads(props.get(ifl.COVERS, "{}")).items():
                cov[r] = max(cov.get(r, 0), int(seq))
    for origin, cov in json.loads(tbl.properties.get(MIGRATED_COVERS, "{}")).items():
        mine = out.setdefault(origin, {})
        for r, seq in cov.items():
            mine[r] = max(mine.get(r, 0), int(seq))
    return out


def migrate(source: str, url: str, level: int = pqlake.ZSTD_LEVEL_EXPORT) -> dict[str, Any]:
    """Copy the live files of the manifest lake ``source`` (folder or ``s3://``; or an exported Parquet
    folder) into the Iceberg lake ``url``; resumable and idempotent (a file already migrated is skipped)."""
    from otel_agenttape.store.lake.read import _folder_catalog
    from otel_agenttape.store.readers import is_lake

    lake = lake_fs(source)
    cat = mf.load_catalog(lake)
    if not cat.listed:
        if not (lake.local and is_lake(lake.base)):
            raise LakeError(f"{source} holds no lake manifest (_manifest/) and is no exported Parquet folder: "
                            "nothing to migrate")
        cat = _folder_catalog(lake)  # `agenttape export parquet` or `serve --parquet-dir`: every file is live
    catalog, parsed = ic.load(url)
    tables = ic.ensure_tables(catalog, parsed.namespace)
    origin = lake.uri
    covers = cat.receivers()
    out: dict[str, Any] = {"from": origin, "to": url, "files": 0, "rows": 0, "written_files": 0, "skipped": 0,
                           "snapshots": 0}
    con = duckdb.connect(":memory:")
    try:
        for table in ic.TABLES:
            tbl = tables[table]
            done = migrated_keys(tbl, origin)
            live = sorted(cat.table_files(table), key=lambda f: f["key"])
            todo = [f for f in live if f["key"] not in done]
            out["skipped"] += len(live) - len(todo)
            first = not done
            for g in range(0, len(todo), MIGRATE_GROUP):
                group = todo[g:g + MIGRATE_GROUP]
                files, hashes, rows = _migrate_files(con, lake, origin, table, tbl, group, level)
                keys = [f["key"] for f in group]
                props = {ifl.KIND: "migrate", MIGRATED: _json({"from": origin, "keys": keys}),
                         ifl.HASHES: _json(hashes), ifl.COVERS: _json(covers)}
                if table == "spans" and first and cat.retention:
                    props[RETENTION] = _json(cat.retention)
                first = False

                def work(tx: Any, files: list[Any] = files, props: dict[str, str] = props) -> None:
                    with tx.update_snapshot(snapshot_properties=props).fast_append() as fa:
                        for f in files:
                            fa.append_data_file(f)

                if ifl.commit(tbl, work, lambda t, keys=keys: set(keys) <= migrated_keys(t, origin)):
                    out["snapshots"] += 1
                out["files"] += len(group)
                out["rows"] += rows
                out["written_files"] += len(files)
    finally:
        con.close()
    return out


def _migrate_files(con: duckdb.DuckDBPyConnection, lake: Any, origin: str, table: str, tbl: Any,
                   group: list[dict[str, Any]], level: int) -> tuple[list[Any], dict[str, str], int]:
    """Write the rows of these source files as data files of ``tbl``, one per partition per source file,
    under names fixed by the source file (a migration run again writes the same names)."""
    fs, _ = ifl.location_fs(tbl.location())
    order = ", ".join(ic.SORT[table])
    files: list[Any] = []
    hashes: dict[str, str] = {}
    rows = 0
    for f in group:
        src = scan_sql(con, lake, table, [f["key"]], "_migrate")
        t = con.sql(f"SELECT * FROM ({src}) ORDER BY {order}").to_arrow_table()
        if f.get("rows") is not None and t.num_rows != int(f["rows"]):
            raise LakeError(f"{origin}/{f['key']}: read {t.num_rows} rows, the manifest lists {f['rows']}: stopped")
        rows += t.num_rows
        name = "migrated-" + hashlib.sha256(f"{origin}/{f['key']}".encode()).hexdigest()[:24] + ".parquet"
        for part, part_rows in ifl.split(table, t, table in pqlake.PARTITIONED):
            key = ifl.file_key(part, name)
            df, digest = ifl.write_data_file(tbl, fs, key, table, part_rows, part, level)
            files.append(df)
            hashes[key] = digest
    return files, hashes, rows


# -- compaction, retention, expiry ---------------------------------------------------------------------
def _chunks(files: list[Any], target: int) -> list[list[Any]]:
    """Consecutive groups of small files, each up to ``target`` bytes; groups of one are left alone."""
    out: list[list[Any]] = []
    cur: list[Any] = []
    size = 0
    for f in files:
        if cur and size + int(f.file_size_in_bytes) > target:
            out.append(cur)
            cur, size = [], 0
        cur.append(f)
        size += int(f.file_size_in_bytes)
    if cur:
        out.append(cur)
    return [c for c in out if len(c) > 1]


def _live(tbl: Any) -> list[Any]:
    if tbl.current_snapshot() is None:
        return []
    return [task.file for task in tbl.scan().plan_files()]


def _read(fs: Any, table: str, files: list[Any]) -> pa.Table:
    from otel_agenttape.store.lake.iceberg_read import object_key

    return ds.dataset([object_key(fs, f.file_path) for f in files], filesystem=fs.fs, format="parquet",
                      schema=ic.arrow_schema(table)).to_table()


def _maintainable(tbl: Any) -> None:
    """Tables created before the isolation settings get them (a maintainer's change commits over appends)."""
    want = {k: v for k, v in ic.TABLE_PROPERTIES.items() if k.endswith("isolation-level")}
    if any(tbl.properties.get(k) != v for k, v in want.items()):
        ifl.commit(tbl, lambda tx: tx.set_properties(want))


def _compaction_orphans(tbl: Any, fs: Any) -> int:
    """Delete the merged files a compaction that stopped before its commit left: named ``compact-*``, live in
    no snapshot the table keeps and waiting in no maintenance snapshot's removal list."""
    base = tbl.location().rstrip("/")
    known = {f.file_path for f in _live(tbl)}
    for snap in tbl.metadata.snapshots:
        known.update(json.loads(ifl.summary_props(snap).get(REMOVED, "[]")))
        known.update(f"{base}/{k}" for k in json.loads(ifl.summary_props(snap).get(ifl.HASHES, "{}")))
    gone = 0
    for key in fs.list("data"):
        if key.rsplit("/", 1)[-1].startswith("compact-") and f"{base}/{key}" not in known and fs.delete(key):
            gone += 1
    return gone


def compact(url: str, target_bytes: int = DEFAULT_TARGET_BYTES, grace_seconds: float = DEFAULT_GRACE_SECONDS,
            level: int = pqlake.ZSTD_LEVEL_EXPORT) -> dict[str, Any]:
    """Merge each partition's small files into files of up to ``target_bytes``, one overwrite snapshot per
    table; then remove what earlier maintenance replaced and expire snapshots, both past the grace period.
    Idempotent: a second run finds nothing to merge. Rows are kept exactly, sorted as the lake sorts them."""
    catalog, parsed = ic.load(url)
    tables = ic.load_tables(catalog, parsed.namespace)
    out: dict[str, Any] = {"merged_files": 0, "written_files": 0, "rows": 0, "deleted": 0, "expired_snapshots": 0}
    stamp = time.time_ns()
    for table, tbl in tables.items():
        _maintainable(tbl)
        fs, _ = ifl.location_fs(tbl.location())
        out["deleted"] += _compaction_orphans(tbl, fs)
        groups: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
        for f in _live(tbl):
            if int(f.file_size_in_bytes) < target_bytes:
                groups[tuple(f.partition)].append(f)
        adds: list[Any] = []
        removes: list[Any] = []
        hashes: dict[str, str] = {}
        for part, members in sorted(groups.items(), key=lambda kv: tuple((v is None, v or 0) for v in kv[0])):
            for k, chunk in enumerate(_chunks(sorted(members, key=lambda f: f.file_path), target_bytes)):
                t = _read(fs, table, chunk).sort_by([(c, "ascending") for c in ic.SORT[table]])
                want = sum(int(f.record_count) for f in chunk)
                if t.num_rows != want:
                    raise LakeError(f"compaction of {tbl.name()} read {t.num_rows} rows of {want}: stopped")
                key = ifl.file_key(part or None, f"compact-{stamp}-{len(adds):04d}.parquet")
                df, digest = ifl.write_data_file(tbl, fs, key, table, t, part or None, level)
                adds.append(df)
                hashes[key] = digest
                removes.extend(chunk)
                out["rows"] += want
        if adds:
            props = {ifl.KIND: "compact", ifl.HASHES: _json(hashes), ifl.COVERS: _json(ifl.coverage(tbl)),
                     REMOVED: _json(sorted(f.file_path for f in removes))}

            def work(tx: Any, adds: list[Any] = adds, removes: list[Any] = removes, props: dict[str, str] = props,
                     tbl: Any = tbl) -> None:
                summary = dict(props)
                # the same rows, so the same runs: the count the snapshot replaced recorded stays true
                cur = tbl.current_snapshot()
                if (runs := ifl.summary_props(cur).get(ifl.RUNS) if cur is not None else None) is not None:
                    summary[ifl.RUNS] = runs
                with tx.update_snapshot(snapshot_properties=summary).overwrite() as ow:
                    for f in removes:
                        ow.delete_data_file(f)
                    for f in adds:
                        ow.append_data_file(f)

            ifl.commit(tbl, work)
            out["merged_files"] += len(removes)
            out["written_files"] += len(adds)
        d, e = _expire(tbl, fs, grace_seconds)
        out["deleted"] += d
        out["expired_snapshots"] += e
    return out


def _expire(tbl: Any, fs: Any, grace_seconds: float) -> tuple[int, int]:
    """Delete the files maintenance snapshots older than the grace period took out of the table (unless live
    again), keep the receivers' coverage as a table property, then expire those snapshots."""
    from otel_agenttape.store.lake.iceberg_read import object_key

    tbl.refresh()
    cutoff_ms = int((time.time() - grace_seconds) * 1000) + (1 if grace_seconds <= 0 else 0)
    past = [s for s in tbl.metadata.snapshots if s.timestamp_ms < cutoff_ms]  # the current one too
    old = [s for s in past if s.snapshot_id != (tbl.current_snapshot().snapshot_id if tbl.current_snapshot() else None)]
    live = {f.file_path for f in _live(tbl)}
    deleted = 0
    for snap in past:
        for path in json.loads(ifl.summary_props(snap).get(REMOVED, "[]")):
            if path not in live:
                key = object_key(fs, path)
                try:
                    fs.fs.delete_file(key)
                    deleted += 1
                except (FileNotFoundError, OSError):
                    pass
    if not old:
        return deleted, 0
    covers = ifl.coverage(tbl)
    migrated: dict[str, list[str]] = json.loads(tbl.properties.get(MIGRATED, "{}"))
    retention = json.loads(tbl.properties.get(RETENTION, "[]"))
    for snap in old:
        props = ifl.summary_props(snap)
        if rec := props.get(MIGRATED):
            doc = json.loads(rec)
            migrated[doc["from"]] = sorted(set(migrated.get(doc["from"], [])) | set(doc["keys"]))
        retention.extend(r for r in json.loads(props.get(RETENTION, "[]")) if r not in retention)
    base = tbl.location().rstrip("/")
    hashes = {k: v for k, v in json.loads(tbl.properties.get(ifl.HASHES, "{}")).items() if k in live}
    for snap in old:  # the sha256 of each live file an expiring snapshot added, for verify
        for key, digest in json.loads(ifl.summary_props(snap).get(ifl.HASHES, "{}")).items():
            path = key if "://" in key else f"{base}/{key}"
            if path in live:
                hashes[path] = digest
    keep = {ifl.COVERS: _json(covers), MIGRATED: _json(migrated), RETENTION: _json(retention),
            ifl.HASHES: _json(hashes), MIGRATED_COVERS: _json(migrated_origins(tbl))}
    ifl.commit(tbl, lambda tx: tx.set_properties(keep))
    tbl.refresh()
    ids: list[int] = []
    for attempt in range(ifl.COMMIT_ATTEMPTS):  # a receiver's commit in between: refresh and expire again
        if attempt:
            time.sleep(0.02 * (1 + attempt % 8))
            tbl.refresh()
        current = tbl.current_snapshot()
        ids = [s.snapshot_id for s in old if tbl.snapshot_by_id(s.snapshot_id) is not None
               and (current is None or s.snapshot_id != current.snapshot_id)]
        if not ids:
            break
        try:
            tbl.maintenance.expire_snapshots().by_ids(ids).commit()
            break
        except Exception as exc:  # noqa: BLE001 - sorted by _retryable
            if not ifl._retryable(exc):
                raise
    else:
        raise LakeError(f"expiring snapshots of {tbl.name()} kept conflicting with other writers")
    return deleted, len(ids)


def retain(url: str, older_than_days: int, grace_seconds: float = DEFAULT_GRACE_SECONDS,
           today: dt.date | None = None) -> dict[str, Any]:
    """Delete every day partition older than ``older_than_days`` (UTC) from the dated tables, one delete
    snapshot per table, recording on ``spans`` the sealed tape ranges that went."""
    from pyiceberg.expressions import LessThan

    cutoff = retention_cutoff(older_than_days, today)  # one rule for every store (``store/retention.py``)
    catalog, parsed = ic.load(url)
    tables = ic.load_tables(catalog, parsed.namespace)
    out: dict[str, Any] = {"removed_files": 0, "rows": 0, "before": cutoff.isoformat(), "chains": 0, "deleted": 0}
    chains_of: dict[frozenset[str], list[Any]] = {}  # the sealed ranges of a set of old span files, read once
    for table, tbl in tables.items():
        if table not in pqlake.PARTITIONED:
            continue
        fs, _ = ifl.location_fs(tbl.location())
        day = (cutoff - ifl.EPOCH).days
        if not [f for f in _live(tbl) if f.partition[0] is not None and int(f.partition[0]) < day]:
            continue
        _maintainable(tbl)
        done: dict[str, Any] = {}

        def work(tx: Any, tbl: Any = tbl, table: str = table, fs: Any = fs, done: dict[str, Any] = done) -> None:
            # computed on each attempt from the table as refreshed: receivers commit meanwhile (new files,
            # maybe another old day), and the record must name exactly the files this delete removes
            old = [f for f in _live(tbl) if f.partition[0] is not None and int(f.partition[0]) < day]
            props = {ifl.KIND: "retain", ifl.COVERS: _json(ifl.coverage(tbl)),
                     REMOVED: _json(sorted(f.file_path for f in old))}
            if table == "spans":
                key = frozenset(f.file_path for f in old)
                if key not in chains_of:
                    t = _read(fs, table, old)
                    got = {(str(c), int(e or 0), int(s), str(h)) for c, e, s, h in zip(
                        t.column("chain_id").to_pylist(), t.column("chain_epoch").to_pylist(),
                        t.column("chain_seq").to_pylist(), t.column("chain_hash").to_pylist())
                        if c is not None and s is not None}
                    chains_of[key] = _islands(sorted(got))
                chains = chains_of[key]
                props[RETENTION] = _json([{"at": mf.now_iso(), "older_than_days": older_than_days,
                                           "before": cutoff.isoformat(), "rows": sum(int(f.record_count) for f in old),
                                           "files": len(old), "chains": chains}])
                done["chains"] = len(chains)
            done["files"], done["rows"] = len(old), sum(int(f.record_count) for f in old)
            tx.delete(LessThan("date", cutoff.isoformat()), snapshot_properties=props)

        ifl.commit(tbl, work)
        out["chains"] += done.get("chains", 0)
        out["removed_files"] += done.get("files", 0)
        out["rows"] += done.get("rows", 0)
        d, _ = _expire(tbl, fs, grace_seconds)
        out["deleted"] += d
    return out


def status(url: str) -> dict[str, Any]:
    """Files, rows and bytes per table, receivers and their last batch, the snapshots kept."""
    catalog, parsed = ic.load(url, create=False)
    tables = ic.load_tables(catalog, parsed.namespace)
    out: dict[str, Any] = {"lake": url, "tables": {}, "receivers": {}}
    for table, tbl in tables.items():
        files = _live(tbl)
        out["tables"][table] = {"files": len(files), "rows": sum(int(f.record_count) for f in files),
                                "bytes": sum(int(f.file_size_in_bytes) for f in files),
                                "snapshots": len(tbl.metadata.snapshots), "metadata": tbl.metadata_location}
        for r, s in ifl.coverage(tbl).items():
            out["receivers"][r] = max(out["receivers"].get(r, 0), s)
    return out


def erase_datasets(url: str) -> dict[str, tuple[Any, Any, list[Any]]]:
    """``{table: (Iceberg table, file system, live data files)}`` of ``spans``, ``span_events`` and
    ``log_records``: what an erasure plans over (``store/erasure_copies.py``)."""
    catalog, parsed = ic.load(url)
    tables = ic.load_tables(catalog, parsed.namespace)
    out = {}
    for table in ("spans", "span_events", "log_records"):
        tbl = tables.get(table)
        if tbl is None:
            continue
        _maintainable(tbl)
        fs, _ = ifl.location_fs(tbl.location())
        out[table] = (tbl, fs, _live(tbl))
    return out


def erase_files(datasets: dict[str, tuple[Any, Any, list[Any]]], rewrite: Any, record: pa.Table | None,
                level: int = pqlake.ZSTD_LEVEL_EXPORT, touches: Any = None,
                batch_rows: int = pqlake.ROW_GROUP_ROWS) -> dict[str, Any]:
    """An erasure in an Iceberg lake: each live file ``rewrite(table, rows)`` changes (it returns the new rows,
    or None) is written again as a new file, and the record's rows are added, in one overwrite snapshot per
    table (``agenttape.operation = erase``); then the replaced files are deleted and the older snapshots
    expired at once (no grace period: an erasure cannot wait for readers).

    A file is read and written ``batch_rows`` rows at a time (a table is never held whole, nor a file;
    what is held is bounded by a data page, ``parquet.DATA_PAGE_BYTES``, read and written, per column):
    ``touches(table, keys)`` says from a file's key columns alone whether it holds an erased row, so the
    files it does not are not read further; without it each file is streamed through ``rewrite`` and
    its new copy kept only if a batch changed."""
    from otel_agenttape.store.lake.iceberg_read import object_key

    out: dict[str, Any] = {"files_rewritten": 0, "files_deleted": 0, "expired_snapshots": 0}
    stamp = time.time_ns()
    for table, (tbl, fs, files) in datasets.items():
        adds: list[Any] = []
        removes: list[Any] = []
        hashes: dict[str, str] = {}
        key_cols = {"span_events": ["trace_id", "span_id", "event_index"], "log_records": ["log_id"]}.get(
            table, ["trace_id", "span_id"])
        for f in files:
            path = object_key(fs, f.file_path)
            if touches is not None:
                with fs.fs.open_input_file(path) as fh:
                    if not touches(table, pq.read_table(fh, columns=key_cols)):
                        continue
            part = tuple(f.partition) or None
            key = ifl.file_key(part, f"erased-{stamp}-{len(adds):04d}.parquet")
            changed = [False]

            def parts(path: str = path, changed: list[bool] = changed) -> Any:
                with fs.fs.open_input_file(path) as fh:
                    # page by page (buffered, not pre-buffered): a row group is not read whole either
                    pf = pq.ParquetFile(fh, pre_buffer=False, buffer_size=1 << 20)
                    for batch in pf.iter_batches(batch_size=batch_rows, use_threads=False):
                        rows = pa.Table.from_batches([batch])
                        new = rewrite(table, rows)
                        if new is not None:
                            changed[0] = True
                        yield rows if new is None else new

            df, digest = ifl.write_data_file_parts(tbl, fs, key, table, parts(), part, level)
            if not changed[0]:
                fs.delete(key)  # streamed through for nothing (no ``touches``): the old file stays
                continue
            adds.append(df)
            hashes[key] = digest
            removes.append(f)
        if table == "spans" and record is not None and record.num_rows:
            for part, rows in ifl.split(table, record, True):
                key = ifl.file_key(part, f"erasure-{stamp}.parquet")
                df, digest = ifl.write_data_file(tbl, fs, key, table, rows, part, level)
                adds.append(df)
                hashes[key] = digest
        if not adds:
            continue
        props = {ifl.KIND: "erase", ifl.HASHES: _json(hashes), ifl.COVERS: _json(ifl.coverage(tbl)),
                 REMOVED: _json(sorted(f.file_path for f in removes))}

        def work(tx: Any, adds: list[Any] = adds, removes: list[Any] = removes, props: dict[str, str] = props) -> None:
            with tx.update_snapshot(snapshot_properties=props).overwrite() as ow:
                for f in removes:
                    ow.delete_data_file(f)
                for f in adds:
                    ow.append_data_file(f)

        ifl.commit(tbl, work)
        out["files_rewritten"] += len(removes)
        d, e = _expire(tbl, fs, 0.0)
        out["files_deleted"] += d
        out["expired_snapshots"] += e
    return out
