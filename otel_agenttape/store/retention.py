"""Retention: one rule for the DuckDB store and the lake, and what it leaves for ``verify``.

The rule (``cutoff``): data dated before UTC today minus ``older_than_days`` goes. The lake drops whole
date partitions (``lake/maintain.retain``); the DuckDB store (``retain_duckdb``) either drops the old
spans with their events and links, and old log records, or with ``content_only`` erases their content
(an erasure, ``store/erasure.py``: the spans and their proofs stay, a signed record says why).

Dropping is recorded as the lake records it: per sealed tape, the seq ranges removed with the hash of
each range's last entry (``islands``), kept in the store's ``store_retention`` table, so ``verify``
reports those entries as removed by retention, not as tampered. Checkpoint and erasure spans are kept
(they hold no content and later entries are checked against them). The store is rewritten in one pass
as an erasure is, and the lake publisher's rowid cursor is moved down past the rows that went.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from otel_agenttape import semconv
from otel_agenttape.store.readers import StoreError

RETENTION_TABLE = "store_retention"
RETENTION_DDL = f"CREATE TABLE IF NOT EXISTS {RETENTION_TABLE} (recorded_at VARCHAR NOT NULL, record JSON NOT NULL)"
_KEEP = (semconv.EVENT_CHECKPOINT, semconv.EVENT_ERASURE)


def cutoff(older_than_days: int, today: dt.date | None = None) -> dt.date:
    """The first UTC date retention keeps."""
    if older_than_days < 0:
        raise ValueError("--older-than must not be negative")
    return (today or dt.datetime.now(dt.timezone.utc).date()) - dt.timedelta(days=older_than_days)


def islands(rows: Sequence[tuple[str, int, int, str]]) -> list[list[Any]]:
    """Runs of consecutive seqs per (chain, epoch): ``[chain_id, epoch, lo, hi, hash of hi]``."""
    out: list[list[Any]] = []
    for cid, ep, seq, h in sorted(rows, key=lambda r: (r[0], r[1], r[2])):
        last = out[-1] if out else None
        if last and last[0] == cid and last[1] == ep and seq == last[3] + 1:
            last[3], last[4] = seq, h
        elif not (last and last[0] == cid and last[1] == ep and seq == last[3]):
            out.append([cid, ep, seq, seq, h])
    return out


def retained_ranges(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], list[tuple[int, int, str]]]:
    """Per (chain id, epoch): the seq ranges the records removed, each with the hash of its last entry."""
    out: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
    for rec in records:
        for cid, epoch, lo, hi, head in rec.get("chains", []):
            out.setdefault((cid, int(epoch)), []).append((int(lo), int(hi), head))
    return out


def store_records(reader: Any) -> list[dict[str, Any]]:
    """The retention records of a DuckDB store (none when it never dropped anything)."""
    try:
        t = reader.query(f"SELECT record FROM {RETENTION_TABLE} ORDER BY recorded_at")
    except Exception:  # noqa: BLE001 - no such table (a store never retained, a lake, a server)
        return []
    return [orjson.loads(r) for r in t.column(0).to_pylist() if r]


def _spans_dropped(day: dt.date, a: str = "s") -> str:
    keep = ", ".join("'" + n + "'" for n in _KEEP)
    return f"{a}.date < DATE '{day.isoformat()}' AND {a}.name NOT IN ({keep})"


def retain_duckdb(path: str | os.PathLike[str], older_than_days: int, *, reason: str, by: str, signer: Any,
                  content_only: bool = False, dry_run: bool = False, today: dt.date | None = None,
                  copies: Sequence[Any] = (), connect: Any = None) -> dict[str, Any]:
    """Apply the retention rule to a DuckDB store file (see the module doc); returns what it did.
    ``connect``: the connection a dry run counts on (a running receiver's cursor; by default the file
    read-only)."""
    from otel_agenttape.store.erasure import connect_readonly, erase_duckdb, rewrite

    t0 = time.perf_counter()
    path = os.fspath(path)
    day = cutoff(older_than_days, today)
    if not reason or not reason.strip():
        raise ValueError("retention needs a reason (--reason)")
    base = {"before": day.isoformat(), "older_than_days": older_than_days, "content_only": content_only,
            "dry_run": dry_run}
    if content_only:
        res = erase_duckdb(path, "date < CAST(? AS DATE)", [day.isoformat()], reason=reason, by=by,
                           selector={"retain_older_than_days": older_than_days, "before": day.isoformat()},
                           signer=signer, dry_run=dry_run, copies=copies, connect=connect if dry_run else None)
        return {**base, **res.to_json(), "rows": 0, "chains": 0}
    if copies:
        raise StoreError("retention drops spans from the store only; a lake keeps its own rule (lake retain)")
    if connect is not None and not dry_run:
        raise ValueError("retention counts on the file itself; connect is for a dry run")
    con = connect() if connect is not None else connect_readonly(path)
    try:
        where = _spans_dropped(day, "spans")
        rows, logs = con.execute(
            f"SELECT (SELECT count(*) FROM spans WHERE {where}), "
            f"(SELECT count(*) FROM log_records WHERE date < DATE '{day.isoformat()}')").fetchone()
        sealed = con.execute(f"SELECT chain_id, coalesce(chain_epoch, 0), chain_seq, chain_hash FROM spans "
                             f"WHERE {where} AND chain_id IS NOT NULL AND chain_seq IS NOT NULL").fetchall()
    finally:
        con.close()
    chains = islands([(str(c), int(e), int(s), str(h)) for c, e, s, h in sealed])
    out = {**base, "spans": int(rows), "log_records": int(logs), "chains": len(chains)}
    if dry_run or not (rows or logs):
        out["seconds"] = time.perf_counter() - t0
        return out
    record = {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "older_than_days": older_than_days,
              "before": day.isoformat(), "reason": reason, "by": by, "spans": int(rows), "log_records": int(logs),
              "chains": chains}
    keyed = (f"EXISTS (SELECT 1 FROM erase_src.main.spans x WHERE {_spans_dropped(day, 'x')} "
             "AND x.trace_id = s.trace_id AND x.span_id = s.span_id)")
    rewrite(path, drop={"spans": _spans_dropped(day), "span_events": keyed, "span_links": keyed,
                        "log_records": f"s.date < DATE '{day.isoformat()}'"},
            extra_sql=[RETENTION_DDL.replace(RETENTION_TABLE, f"erase_dst.main.{RETENTION_TABLE}"),
                       (f"INSERT INTO erase_dst.main.{RETENTION_TABLE} VALUES (?, ?)",
                        [record["at"], orjson.dumps(record).decode()])])
    out["seconds"] = time.perf_counter() - t0
    return out
