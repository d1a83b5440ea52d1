"""Lake maintenance: ``compact`` merges small files, ``retain`` drops whole old date partitions.

Both write their result as one new snapshot (``manifest.py``), the single step that changes the
live file set; receivers keep publishing meanwhile (their new entries are not covered by it, so they
stay live). Files taken out of the live set are deleted only after ``grace_seconds`` (by a later
run), so a reader that listed the manifest just before still finds them. Run one maintainer per lake
at a time (a cron job, a Kubernetes CronJob with ``concurrencyPolicy: Forbid``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from typing import Any

import duckdb

from otel_agenttape.store import parquet as pqlake
from otel_agenttape.store import retention
from otel_agenttape.store.lake import manifest as mf
from otel_agenttape.store.lake.files import RUN_TRACES, write_or_skip
from otel_agenttape.store.lake.fs import LakeFS, lake_fs
from otel_agenttape.store.lake.read import scan_sql

DEFAULT_TARGET_BYTES = 256 * 1024 * 1024
DEFAULT_GRACE_SECONDS = 600.0
_SORT = {**pqlake.SORT_KEYS, RUN_TRACES: ["run_id", "trace_id", "parent_run_id"]}


def _chunks(files: list[dict[str, Any]], target: int) -> list[list[dict[str, Any]]]:
    """Consecutive groups of small files, each up to ``target`` bytes; groups of one are left alone."""
    out: list[list[dict[str, Any]]] = []
    cur: list[dict[str, Any]] = []
    size = 0
    for f in files:
        if cur and size + f["bytes"] > target:
            out.append(cur)
            cur, size = [], 0
        cur.append(f)
        size += f["bytes"]
    if cur:
        out.append(cur)
    return [c for c in out if len(c) > 1]


def new_snapshot(cat: mf.Catalog, files: dict[str, dict[str, Any]], removed: list[dict[str, Any]],
                 retention: list[dict[str, Any]], now: float, grace: float) -> tuple[dict[str, Any], list[str]]:
    """The next snapshot, and the keys that may be deleted once it is written."""
    covers = dict(cat.covers)
    for key in cat.entries:
        rs = mf.entry_receiver_seq(key)
        if rs:
            covers[rs[0]] = max(covers.get(rs[0], 0), rs[1])
    old = list((cat.snapshot or {}).get("removed", []))
    keep = [r for r in old if now - float(r["at"]) < grace]
    delete = [r["key"] for r in old if now - float(r["at"]) >= grace]
    fresh = [{"key": r["key"], "at": now} for r in removed]
    if grace <= 0:
        delete += [r["key"] for r in fresh]
        fresh = []
    # entries and snapshots the previous snapshot already superseded, once it is older than the grace
    prev_at = float((cat.snapshot or {}).get("written_unix", now))
    if cat.snapshot is not None and now - prev_at >= grace:
        for key in cat.listed:
            rs = mf.entry_receiver_seq(key)
            if rs and rs[1] <= int(cat.snapshot.get("covers", {}).get(rs[0], 0)):
                delete.append(key)
        delete += [mf.snapshot_key(g) for g in mf.snapshot_generations(cat.listed) if g < cat.generation]
    snap = {"format": mf.FORMAT, "generation": cat.generation + 1, "written": mf.now_iso(), "written_unix": now,
            "covers": covers, "files": sorted(files.values(), key=lambda f: f["key"]),
            "removed": keep + fresh, "retention": retention}
    return snap, delete


def commit_snapshot(lake: LakeFS, snap: dict[str, Any], delete: list[str]) -> int:
    """Write the snapshot (readers list the lake from it on), then delete what it dropped; returns the
    files deleted."""
    lake.put_bytes(mf.snapshot_key(snap["generation"]), mf.dumps(snap))
    return sum(1 for k in delete if lake.delete(k))


def compact(uri: str | LakeFS, target_bytes: int = DEFAULT_TARGET_BYTES, grace_seconds: float = DEFAULT_GRACE_SECONDS,
            level: int = pqlake.ZSTD_LEVEL_EXPORT) -> dict[str, Any]:
    """Merge each (table, date)'s small files into files of up to ``target_bytes``; idempotent (a second run
    finds nothing to merge). Rows are kept exactly, sorted as the lake sorts them."""
    lake = uri if isinstance(uri, LakeFS) else lake_fs(uri)
    cat = mf.load_catalog(lake)
    gen = cat.generation + 1
    groups: dict[tuple[str, str | None], list[dict[str, Any]]] = defaultdict(list)
    for f in cat.files.values():
        if f["bytes"] < target_bytes:
            groups[(f["table"], f.get("date"))].append(f)
    files = dict(cat.files)
    removed: list[dict[str, Any]] = []
    merged_rows = 0
    con = duckdb.connect(":memory:")
    try:
        for (table, day), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            for k, chunk in enumerate(_chunks(sorted(members, key=lambda f: f["key"]), target_bytes)):
                folder = table if day is None else f"{table}/date={day}"
                key = f"{folder}/compact-{gen:010d}-{k:04d}.parquet"
                src = scan_sql(con, lake, table, [f["key"] for f in chunk], f"_c{len(removed)}")
                order = ", ".join(_SORT[table])
                batches = con.sql(f"SELECT * FROM ({src}) ORDER BY {order}").to_arrow_reader(32 * 1024)
                rec = write_or_skip(lake, key, table, batches, level)
                want = sum(int(f["rows"]) for f in chunk)
                if rec is None or rec["rows"] != want:
                    lake.delete(key)
                    raise RuntimeError(f"compaction of {folder} read {rec and rec['rows']} rows of {want}: stopped")
                if day is not None:
                    rec["date"] = day
                files[key] = rec
                for f in chunk:
                    files.pop(f["key"], None)
                    removed.append(f)
                merged_rows += want
    finally:
        con.close()
    if not removed and not cat.entries and not (cat.snapshot or {}).get("removed"):
        return {"merged_files": 0, "written_files": 0, "rows": 0, "deleted": 0, "generation": cat.generation}
    snap, delete = new_snapshot(cat, files, removed, list((cat.snapshot or {}).get("retention", [])),
                                 time.time(), grace_seconds)
    deleted = commit_snapshot(lake, snap, delete)
    return {"merged_files": len(removed), "written_files": len([k for k in files if k not in cat.files]),
            "rows": merged_rows, "deleted": deleted, "generation": snap["generation"]}


def retain(uri: str | LakeFS, older_than_days: int, grace_seconds: float = DEFAULT_GRACE_SECONDS,
           today: dt.date | None = None) -> dict[str, Any]:
    """Drop every dated partition older than ``older_than_days`` (UTC dates) and record what went:
    the files, their rows, and per sealed tape the seq ranges removed with the hash of each range's last
    entry, so that ``verify`` reports those entries as removed by retention, not as tampered."""
    cutoff = retention.cutoff(older_than_days, today)  # the store's rule too (``store/retention.py``)
    lake = uri if isinstance(uri, LakeFS) else lake_fs(uri)
    cat = mf.load_catalog(lake)
    old = [f for f in cat.files.values() if f.get("date") and dt.date.fromisoformat(f["date"]) < cutoff]
    if not old:
        return {"removed_files": 0, "rows": 0, "before": cutoff.isoformat(), "chains": 0, "deleted": 0}
    chains: list[list[Any]] = []
    span_keys = [f["key"] for f in old if f["table"] == "spans"]
    if span_keys:
        con = duckdb.connect(":memory:")
        try:
            src = scan_sql(con, lake, "spans", span_keys, "_r")
            got = con.sql(f"SELECT chain_id, coalesce(chain_epoch, 0), chain_seq, chain_hash FROM ({src}) "
                          "WHERE chain_id IS NOT NULL AND chain_seq IS NOT NULL").fetchall()
        finally:
            con.close()
        chains = retention.islands([(str(c), int(e), int(s), str(h)) for c, e, s, h in got])
    record = {"at": mf.now_iso(), "older_than_days": older_than_days, "before": cutoff.isoformat(),
              "files": sorted(f["key"] for f in old), "rows": sum(int(f["rows"]) for f in old), "chains": chains}
    gone = {f["key"] for f in old}
    files = {k: f for k, f in cat.files.items() if k not in gone}
    records = [*(cat.snapshot or {}).get("retention", []), record]
    snap, delete = new_snapshot(cat, files, old, records, time.time(), grace_seconds)
    deleted = commit_snapshot(lake, snap, delete)
    return {"removed_files": len(old), "rows": record["rows"], "before": record["before"], "chains": len(chains),
            "deleted": deleted, "generation": snap["generation"]}


def status(uri: str | LakeFS) -> dict[str, Any]:
    """What the manifest lists: files and rows per table, receivers and their last batch, retention."""
    lake = uri if isinstance(uri, LakeFS) else lake_fs(uri)
    cat = mf.load_catalog(lake)
    tables: dict[str, dict[str, int]] = {}
    for f in cat.files.values():
        t = tables.setdefault(f["table"], {"files": 0, "rows": 0, "bytes": 0})
        t["files"] += 1
        t["rows"] += int(f["rows"])
        t["bytes"] += int(f["bytes"])
    return {"lake": lake.uri, "generation": cat.generation, "receivers": cat.receivers(), "tables": tables,
            "uncovered_entries": len(cat.entries), "retention": [
                {k: r[k] for k in ("at", "before", "rows")} | {"files": len(r["files"])} for r in cat.retention]}
