"""Erasure in a DuckDB store file: content values and their salts removed, the record written, the file rewritten.

``erase_duckdb`` takes a ``spans`` filter (``tape/erase.py`` builds it from a session, run, trace or
time), erases every salted content value of the selected leaf v2 spans and of their events
(``integrity.erasure.erase_span``: the value and its salt go, the commitment stays, so the tapes still
verify), and writes one erasure record, sealed and signed, as an ``agenttape.erasure`` span. Content of
unsealed spans (no chain, nothing to prove) is removed outright; sealed v1 spans commit to their
content itself, so erasing it would break their tape: they are left and counted.

DuckDB neither zeroes the blocks an update frees nor rewrites a block it does not change, so the store
is not updated in place: its schema and live rows are copied into a new file with the changes applied
(one pass, the old file only read), which is checkpointed and renamed over the old one. No copy of an
erased value is left in the file, its WAL or its free blocks, and an interrupted erasure leaves the
old file as it was. The file must not be open in another process (a running receiver holds it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from otel_agenttape import semconv
from otel_agenttape.integrity import log_leaf
from otel_agenttape.integrity.erasure import build_record, erase_span, sign_record
from otel_agenttape.integrity.leaf import CommitmentError
from otel_agenttape.integrity.note import Signer
from otel_agenttape.store.readers import StoreError, StoreOpenError, is_lock_error, open_error_message

_CONTENT = semconv.CONTENT_KEYS


@dataclass
class EraseResult:
    """What an erasure did (or, with ``dry_run``, would do)."""

    erasure_id: str | None
    dry_run: bool
    spans: int = 0  # sealed spans with values erased
    values: int = 0
    unsealed_spans: int = 0  # spans without a chain whose content was removed outright
    unsealed_values: int = 0
    skipped_v1_spans: int = 0  # sealed v1 spans holding content: not erasable without breaking the tape
    selected_spans: int = 0
    keys: list[str] = field(default_factory=list)  # the attribute keys erased
    seconds: float = 0.0
    copies: list[dict[str, Any]] = field(default_factory=list)  # per copy: what it is, what was erased there

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def connect_readonly(path: str) -> duckdb.DuckDBPyConnection:
    """The store file read-only, to plan on (the new file is written beside it, ``rewrite``); a file a
    running receiver holds is named as such."""
    if not os.path.exists(path):
        raise StoreError(f"no tape store at {path}")
    try:
        return duckdb.connect(path, read_only=True)  # the new file is written beside it (``rewrite``)
    except duckdb.Error as exc:
        if is_lock_error(exc):
            raise StoreOpenError(f"{path} is open in another process (a running receiver?): stop it, then erase") from exc
        raise StoreOpenError(open_error_message(path, exc)) from exc


def _loads(text: Any) -> dict[str, Any]:
    return orjson.loads(text) if isinstance(text, (str, bytes)) and text else {}


@dataclass
class Plan:
    """What erasing the selected spans of one copy changes: the new typed attribute sets, keyed by span
    ``(trace_id, span_id)`` and event ``(trace_id, span_id, event_index)``, and the record's entries."""

    spans: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: dict[tuple[str, str, int], dict[str, Any]] = field(default_factory=dict)
    record_spans: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    selected: set[tuple[str, str]] = field(default_factory=set)
    logs: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)  # log_id -> (body, attributes)

    def __bool__(self) -> bool:
        return bool(self.spans or self.events or self.logs)

    def log_json(self) -> list[tuple[str, str | None, str]]:
        return [(lid, None if body is None else orjson.dumps(body).decode(), orjson.dumps(a).decode())
                for lid, (body, a) in self.logs.items()]

    def span_json(self) -> list[tuple[str, str, str]]:
        return [(t, s, orjson.dumps(a).decode()) for (t, s), a in self.spans.items()]

    def event_json(self) -> list[tuple[str, str, int, str]]:
        return [(t, s, i, orjson.dumps(a).decode()) for (t, s, i), a in self.events.items()]


def plan(con: duckdb.DuckDBPyConnection, where: str, params: Sequence[Any], result: EraseResult,
         also: Sequence[tuple[str, str]] = (), logs: bool = False) -> Plan:
    """Plan the erasure of the spans ``where`` selects (plus the spans ``also`` names) over the ``spans``
    and ``span_events`` relations of ``con`` (``logs``: and the ``log_records`` of those spans),
    counting into ``result``. Nothing is written."""
    cond = f"({where})"
    if also:
        con.register("erase_also", pa.table({"trace_id": [k[0] for k in also], "span_id": [k[1] for k in also]}))
        cond += (" OR EXISTS (SELECT 1 FROM erase_also k WHERE k.trace_id = spans.trace_id "
                 "AND k.span_id = spans.span_id)")
    rows = con.execute(
        f"SELECT trace_id, span_id, attributes, chain_id, chain_epoch, chain_seq FROM spans WHERE ({cond}) "
        f"AND name <> ?", [*params, semconv.EVENT_ERASURE]).fetchall()
    spans, seen = [], set()
    for r in rows:  # a request log may hold a span twice (a retried request): once is enough
        if (r[0], r[1]) not in seen:
            seen.add((r[0], r[1]))
            spans.append(r)
    out = Plan(selected=seen)
    result.selected_spans += len(spans)
    if not spans:
        return out
    keys_tbl = pa.table({"trace_id": [s[0] for s in spans], "span_id": [s[1] for s in spans]})
    con.register("erase_keys", keys_tbl)
    events: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
    for tid, sid, idx, attrs in con.execute(
            "SELECT DISTINCT ON (e.trace_id, e.span_id, e.event_index) e.trace_id, e.span_id, e.event_index, "
            "e.attributes FROM span_events e SEMI JOIN erase_keys k ON e.trace_id = k.trace_id AND "
            "e.span_id = k.span_id ORDER BY e.trace_id, e.span_id, e.event_index").fetchall():
        events.setdefault((tid, sid), []).append((idx, _loads(attrs)))
    log_rows: dict[tuple[str, str], list[tuple[str, Any, dict[str, Any], dict[str, Any]]]] = {}
    if logs and _has_table(con, "log_records"):
        cols = ", ".join(f"l.{c}" for c in _LOG_COLUMNS)
        for row in con.execute(f"SELECT {cols} FROM log_records l SEMI JOIN erase_keys k ON "
                               "l.trace_id = k.trace_id AND l.span_id = k.span_id").fetchall():
            r = dict(zip(_LOG_COLUMNS, row))
            log_rows.setdefault((r["trace_id"], r["span_id"]), []).append(
                (r["log_id"], orjson.loads(r["body"]) if r["body"] else None, _loads(r["attributes"]), r))
    con.unregister("erase_keys")
    for tid, sid, text, chain_id, epoch, seq in spans:
        if (tid, sid) in log_rows:
            _plan_logs(out, result, log_rows[(tid, sid)], (tid, sid, chain_id, epoch, seq))
        attrs = _loads(text)
        evs = events.get((tid, sid), [])
        if semconv.CHAIN_SALTS in attrs:
            try:
                done = erase_span(attrs, [a for _, a in evs])
            except CommitmentError:
                continue  # salts that do not fit: the span does not verify; verify says why
            if not done.erased:
                continue
            result.values += len(done.erased)
            out.keys.update(label.rsplit(":", 1)[-1] if label.startswith("event:") else label
                            for label in done.erased)
            out.spans[(tid, sid)] = done.attributes
            for i in done.changed_events:
                out.events[(tid, sid, evs[i][0])] = done.events[i]
            entry = _record_entry(out, tid, sid, chain_id, epoch, seq)
            entry["erased"] = {**entry["erased"], **done.erased}
            continue
        held = [k for k in attrs if k in _CONTENT]
        held_ev = [(idx, [k for k in a if k in _CONTENT]) for idx, a in evs]
        if not held and not any(ks for _, ks in held_ev):
            continue
        if chain_id is not None:
            result.skipped_v1_spans += 1
            continue
        result.unsealed_spans += 1
        result.unsealed_values += len(held) + sum(len(ks) for _, ks in held_ev)
        out.keys.update(held)
        if held:
            out.spans[(tid, sid)] = {k: v for k, v in attrs.items() if k not in _CONTENT}
        for (idx, a), (_, ks) in zip(evs, held_ev):
            if ks:
                out.keys.update(ks)
                out.events[(tid, sid, idx)] = {k: v for k, v in a.items() if k not in _CONTENT}
    result.spans += len(out.record_spans)  # sealed spans with values erased (their own or their logs')
    return out


_LOG_COLUMNS = ("log_id", "trace_id", "span_id", "time_unix_nano", "observed_time_unix_nano", "severity_number",
                "severity_text", "event_name", "body", "attributes", "flags", "dropped_attributes_count")


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether ``name`` is a table, view or registered relation of ``con``."""
    try:
        con.execute(f"SELECT 1 FROM {_quote(name)} LIMIT 0").fetchall()
    except duckdb.CatalogException:
        return False
    return True


def _record_entry(out: Plan, tid: str, sid: str, chain_id: Any, epoch: Any, seq: Any) -> dict[str, Any]:
    """The erasure record's entry for a span (created on first use)."""
    entry = out.record_spans.get((tid, sid))
    if entry is None:
        entry = out.record_spans[(tid, sid)] = {
            "trace_id": tid, "span_id": sid, "chain_id": chain_id, "epoch": int(epoch or 0),
            "seq": int(seq if seq is not None else -1), "erased": {}}
    return entry


def _plan_logs(out: Plan, result: EraseResult, rows: Sequence[tuple[str, Any, dict[str, Any], dict[str, Any]]],
               span: tuple[str, str, Any, Any, Any]) -> None:
    """The log records of one selected span: a sealed record (``log_leaf.LOG_SEALED``) has its salted
    values erased with their commitments kept, named in the record by its leaf hash; any other record
    of the span loses its body and content attributes outright."""
    tid, sid, chain_id, epoch, seq = span
    for log_id, body, attrs, row in rows:
        if log_leaf.LOG_SEALED in attrs and semconv.CHAIN_SALTS in attrs and chain_id is not None:
            try:
                leaf = log_leaf.leaf_from_row(row, attrs)
                new_body, new_attrs, erased = log_leaf.erase_log(body, attrs)
            except CommitmentError:
                continue  # salts that do not fit: the record does not verify; verify says why
            if not erased:
                continue
            result.values += len(erased)
            out.keys.update(erased)
            out.logs[log_id] = (new_body, new_attrs)
            entry = _record_entry(out, tid, sid, chain_id, epoch, seq)
            entry["erased"] = {**entry["erased"], **{log_leaf.erased_label(leaf, k): c for k, c in erased.items()}}
            continue
        if log_leaf.LOG_SEALED in attrs:
            continue  # sealed without salts: no content of its own to erase
        held = [k for k in attrs if k in _CONTENT]
        if body is None and not held:
            continue
        result.unsealed_values += len(held) + (body is not None)
        out.keys.update(held)
        if body is not None:
            out.keys.add(log_leaf.BODY_LABEL)
        out.logs[log_id] = (None, {k: v for k, v in attrs.items() if k not in _CONTENT})


def erase_duckdb(path: str | os.PathLike[str], where: str, params: Sequence[Any], *, reason: str, by: str,
                 selector: Mapping[str, Any], signer: Signer, dry_run: bool = False,
                 copies: Sequence[Any] = (),
                 connect: Callable[[], duckdb.DuckDBPyConnection] | None = None) -> EraseResult:
    """Erase the content of the spans ``where`` selects (a condition on ``spans``) in a DuckDB file, and
    in each of ``copies`` (``store/erasure_copies.py``: a Parquet export, a lake, a receiver's WAL, an
    outbox) the same spans and any more that the selection picks there. One record names them all.
    ``connect``: the connection to plan on (a running receiver's cursor for a dry run; by default the
    file read-only)."""
    t0 = time.perf_counter()
    path = os.fspath(path)
    if not reason or not reason.strip():
        raise ValueError("an erasure needs a reason (--reason)")
    if connect is not None and not dry_run:
        raise ValueError("an erasure plans on the file itself; connect is for a dry run")
    con = connect() if connect is not None else connect_readonly(path)
    try:
        result = EraseResult(None, dry_run)
        main = plan(con, where, params, result, logs=True)
    finally:
        con.close()
    plans = []
    try:
        for copy in copies:
            counts = EraseResult(None, dry_run)
            p = copy.plan(where, params, sorted(main.selected), counts)
            plans.append((copy, p, counts))
            result.copies.append({**copy.describe(), "spans": counts.spans, "values": counts.values,
                                  "unsealed_values": counts.unsealed_values})
        record_spans = dict(main.record_spans)
        keys = set(main.keys)
        for _, p, _ in plans:
            keys |= p.keys
            for k, v in p.record_spans.items():
                record_spans.setdefault(k, v)
        result.keys = sorted(keys)
        if dry_run or not (main or any(p for _, p, _ in plans)):
            result.seconds = time.perf_counter() - t0
            return result
        now = time.time_ns()
        record = build_record(list(record_spans.values()), reason=reason, by=by, selector=selector,
                              time_unix_nano=now)
        result.erasure_id = record["id"]
        note = sign_record(record, signer)
        row = _record_row(record, note, signer, now)
        rewrite(path, main.span_json(), main.event_json(), row, log_updates=main.log_json())
        if plans:
            record_table = _read_record(path, row[0])
            for (copy, p, _), out in zip(plans, result.copies):
                out.update(copy.apply(p, record_table))
    finally:
        for copy in copies:
            copy.close()
    result.seconds = time.perf_counter() - t0
    return result


def _read_record(path: str, trace_id: str) -> pa.Table:
    """The record's row as the store holds it (every column), for the copies that are read as stores."""
    con = duckdb.connect(path, read_only=True)
    try:
        return con.sql("SELECT * FROM spans WHERE trace_id = ?", params=[trace_id]).to_arrow_table()
    finally:
        con.close()


def _record_row(record: dict[str, Any], note: str, signer: Signer, now: int) -> list[Any]:
    """The record as an ``agenttape.erasure`` span of its own trace (read back by ``verify``)."""
    attrs = {
        semconv.ERASURE_ID: {"s": record["id"]},
        semconv.ERASURE_KEY: {"s": signer.verifier().vkey()},
        semconv.ERASURE_NOTE: {"s": note},
        semconv.ERASURE_RECORD: {"s": orjson.dumps(record).decode()},
    }
    return [os.urandom(16).hex(), os.urandom(8).hex(), semconv.EVENT_ERASURE, now, now,
            orjson.dumps(attrs, option=orjson.OPT_SORT_KEYS).decode(), semconv.SCOPE_INTEGRITY, now]


_RECORD_INSERT = (
    "INSERT INTO erase_dst.main.spans (trace_id, span_id, name, kind, start_time_unix_nano, end_time_unix_nano, "
    "duration_ms, status_code, attributes, dropped_attributes_count, dropped_events_count, dropped_links_count, "
    "scope_name, date) VALUES (?, ?, ?, 1, ?, ?, 0, 0, ?, 0, 0, 0, ?, CAST(make_timestamp(? // 1000) AS DATE))")


_PUBLISHED = {"spans": "spans", "span_events": "events", "span_links": "links", "log_records": "logs"}


def rewrite(path: str, span_updates: Sequence[tuple] = (), event_updates: Sequence[tuple] = (),
            record_row: Sequence[Any] | None = None, drop: Mapping[str, str] | None = None,
            extra_sql: Sequence[Any] = (), log_updates: Sequence[tuple] = ()) -> None:
    """Write a new DuckDB file from the live rows of ``path`` with the updates applied (``span_updates``:
    ``(trace_id, span_id, attributes)``, ``event_updates``: ``(trace_id, span_id, event_index,
    attributes)``, ``log_updates``: ``(log_id, body, attributes)``) and the record row added, checkpoint it and rename it over ``path``. ``drop``: per
    table, a condition on its row ``s`` for the rows left out (retention); the lake publisher's rowid
    cursor (``lake_publications``) is moved down by the rows left out before each position.
    ``extra_sql``: statements (text, or ``(text, params)``) run on the new file last.

    The old file is only read, so an interrupted erasure leaves it as it was; the new one holds no
    freed block and no WAL, so no earlier version of a changed value survives in it."""
    tmp = path + ".erasing"
    for stale in (tmp, tmp + ".wal"):
        if os.path.exists(stale):
            os.remove(stale)
    # rows keep their order, so their rowids: the lake publisher reads the store by rowid ranges
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH {_literal(path)} AS erase_src (READ_ONLY)")
        con.execute(f"ATTACH {_literal(tmp)} AS erase_dst")
        con.execute("COPY FROM DATABASE erase_src TO erase_dst (SCHEMA)")
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'erase_src' AND schema_name = 'main'"
        ).fetchall()]
        if span_updates:
            con.register("erase_spans", pa.table({
                "trace_id": [u[0] for u in span_updates], "span_id": [u[1] for u in span_updates],
                "attributes": [u[2] for u in span_updates]}))
        if event_updates:
            con.register("erase_events", pa.table({
                "trace_id": [u[0] for u in event_updates], "span_id": [u[1] for u in event_updates],
                "event_index": pa.array([u[2] for u in event_updates], pa.int32()),
                "attributes": [u[3] for u in event_updates]}))
        if log_updates:
            con.register("erase_logs", pa.table({
                "log_id": [u[0] for u in log_updates], "body": pa.array([u[1] for u in log_updates], pa.string()),
                "attributes": [u[2] for u in log_updates]}))
        drop = {t: c for t, c in (drop or {}).items() if t in tables}
        for t, cond in drop.items():
            con.execute(f"CREATE TEMP TABLE {_quote('erase_gone_' + t)} AS SELECT s.rowid AS rid "
                        f"FROM erase_src.main.{_quote(t)} s WHERE {cond}")
        for t in tables:
            q = _quote(t)
            keep = f" WHERE NOT ({drop[t]})" if t in drop else ""
            if t == "spans" and span_updates:
                con.execute(f"INSERT INTO erase_dst.main.{q} SELECT s.* REPLACE (coalesce(u.attributes, "
                            f"s.attributes) AS attributes) FROM erase_src.main.{q} s LEFT JOIN erase_spans u "
                            f"ON s.trace_id = u.trace_id AND s.span_id = u.span_id{keep}")
            elif t == "span_events" and event_updates:
                con.execute(f"INSERT INTO erase_dst.main.{q} SELECT s.* REPLACE (coalesce(u.attributes, "
                            f"s.attributes) AS attributes) FROM erase_src.main.{q} s LEFT JOIN erase_events u "
                            "ON s.trace_id = u.trace_id AND s.span_id = u.span_id AND s.event_index = u.event_index"
                            f"{keep}")
            elif t == "log_records" and log_updates:
                con.execute(f"INSERT INTO erase_dst.main.{q} SELECT s.* REPLACE (CASE WHEN u.log_id IS NULL "
                            "THEN s.body ELSE u.body END AS body, coalesce(u.attributes, s.attributes) AS attributes) "
                            f"FROM erase_src.main.{q} s LEFT JOIN erase_logs u ON s.log_id = u.log_id{keep}")
            else:
                con.execute(f"INSERT INTO erase_dst.main.{q} SELECT s.* FROM erase_src.main.{q} s{keep}")
        if drop and "lake_publications" in tables:
            for t in drop:
                c = _PUBLISHED.get(t)
                if c is None:
                    continue
                gone = _quote("erase_gone_" + t)
                con.execute(f"UPDATE erase_dst.main.lake_publications SET "
                            f"{c}_lo = {c}_lo - (SELECT count(*) FROM {gone} WHERE rid < {c}_lo), "
                            f"{c}_hi = {c}_hi - (SELECT count(*) FROM {gone} WHERE rid < {c}_hi)")
        if record_row is not None:
            con.execute(_RECORD_INSERT, list(record_row))
        for stmt in extra_sql:
            text, args = (stmt, None) if isinstance(stmt, str) else stmt
            con.execute(text, args)
        con.execute("CHECKPOINT erase_dst")
        con.execute("DETACH erase_dst")
        con.execute("DETACH erase_src")
    except BaseException:
        con.close()
        for stale in (tmp, tmp + ".wal"):
            if os.path.exists(stale):
                os.remove(stale)
        raise
    con.close()
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    wal = path + ".wal"
    if os.path.exists(wal):
        os.remove(wal)
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
