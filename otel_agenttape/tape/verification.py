"""Verify sealed tapes from the store (DuckDB file, Parquet lake, or OTLP files loaded in memory).

Every leaf is recomputed from the stored ``spans`` / ``span_events`` / ``span_links`` rows; the
stored chain fields are read from the typed ``attributes`` (the truth) and compared with the
promoted ``chain_*`` columns. Checkpoints come from ``agenttape.checkpoint`` spans or log records
in the store and from local checkpoint files; with a pinned key only the checkpoints it signed count.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import orjson

from otel_agenttape import semconv
from otel_agenttape.integrity.chain import link_from_leaf_hash
from otel_agenttape.integrity.checkpoint import parse_origin, read_checkpoint_file
from otel_agenttape.integrity.leaf import LEAF_VERSION, leaf_bytes, project_row
from otel_agenttape.integrity.merkle import leaf_hash
from otel_agenttape.integrity.note import Verifier
from otel_agenttape.integrity.verify import (
    ChainReport,
    Entry,
    SignedCheckpoint,
    assign_checkpoints,
    parse_notes,
    verify_chain,
)

SPAN_COLS = (
    "trace_id, span_id, parent_span_id, trace_state, name, kind, start_time_unix_nano, end_time_unix_nano, "
    "status_code, status_message, attributes, dropped_attributes_count, dropped_events_count, "
    "dropped_links_count, chain_id, chain_seq, chain_prev, chain_hash, chain_epoch"
)
EVENT_COLS = "e.trace_id, e.span_id, e.event_index, e.time_unix_nano, e.name, e.attributes, e.dropped_attributes_count"
LINK_COLS = (
    "l.trace_id, l.span_id, l.link_index, l.linked_trace_id, l.linked_span_id, l.trace_state, l.attributes, "
    "l.dropped_attributes_count"
)


def _rows(table: Any) -> list[dict[str, Any]]:
    cols = table.column_names
    data = [table.column(c).to_pylist() for c in cols]
    return [dict(zip(cols, vals)) for vals in zip(*data)]


def _chain_filter(run: str | None) -> tuple[str, list[Any]]:
    if run is None:
        return "chain_id IS NOT NULL", []
    return "chain_id IN (SELECT DISTINCT chain_id FROM spans WHERE chain_id = ? OR run_id = ?)", [run, run]


def iter_rows(reader: Any, where: str = "chain_id IS NOT NULL", params: Sequence[Any] = (),
              batch_rows: int = 65536) -> Iterator[dict[str, Any]]:
    """Span rows (with ``events`` and ``links`` lists attached) selected by a ``spans`` filter."""
    spans, ev_by, lk_by = _query(reader, where, params)
    for rb in spans.to_batches(max_chunksize=batch_rows):
        yield from _batch_rows(rb, ev_by, lk_by)


def _batch_rows(rb: Any, ev_by: dict, lk_by: dict) -> Iterator[dict[str, Any]]:
    no_events: list[dict[str, Any]] = []
    cols = rb.schema.names
    data = [rb.column(i).to_pylist() for i in range(len(cols))]
    for vals in zip(*data):
        r = dict(zip(cols, vals))
        key = (r["trace_id"], r["span_id"])
        r["events"] = ev_by.get(key, no_events) if ev_by else no_events
        r["links"] = lk_by.get(key, no_events) if lk_by else no_events
        yield r


# A compact entry as a plain tuple (cheap to send back from a worker process):
# (chain_id, epoch, seq, prev, hash, computed_hash, merkle_leaf, span_id, trace_id, problem)
CompactEntry = tuple


def _entry(t: CompactEntry) -> tuple[str, int, Entry]:
    return t[0], t[1], Entry(t[2], t[3], t[4], None, t[7], t[8], t[9], t[5], t[6])


def _compact(chain_id: str, epoch: int, e: Entry) -> CompactEntry:
    e.compact()
    return (chain_id, epoch, e.seq, e.prev, e.hash, e.computed_hash, e.merkle_leaf, e.span_id, e.trace_id, e.problem)


_CHAIN_ID, _CHAIN_SEQ, _CHAIN_PREV, _CHAIN_HASH, _CHAIN_EPOCH = (
    semconv.CHAIN_ID, semconv.CHAIN_SEQ, semconv.CHAIN_PREV, semconv.CHAIN_HASH, semconv.CHAIN_EPOCH)
_loads = orjson.loads
_dumps = orjson.dumps
_SORTED = orjson.OPT_SORT_KEYS


def _stored_attrs(text: Any) -> Any:
    return _loads(text) if isinstance(text, (str, bytes)) and text else (text or {})


def _fast_events(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"attributes": _stored_attrs(e["attributes"]),
             "dropped_attributes_count": int(e.get("dropped_attributes_count") or 0),
             "name": e["name"], "time_unix_nano": str(int(e["time_unix_nano"]))}
            for e in sorted(rows, key=lambda r: r["event_index"])]


def _fast_links(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"attributes": _stored_attrs(r["attributes"]),
             "dropped_attributes_count": int(r.get("dropped_attributes_count") or 0),
             "span_id": r["linked_span_id"], "trace_id": r["linked_trace_id"]}
            for r in sorted(rows, key=lambda r: r["link_index"])]


def _batch_entries(rb: Any, ev_by: dict, lk_by: dict) -> list[CompactEntry]:
    """Compact entries of one record batch (runs in a worker process for large tapes).

    The fast path serializes the leaf straight from the stored typed JSON (already the leaf's typed
    form, kept in key order by the store; orjson re-sorts by code point) and accepts it only when it
    reproduces the stored chain hash: then it is, byte for byte, the leaf that was sealed, which is
    also what the general projection gives. Any other row (edited, malformed, chain fields missing or
    disagreeing, keys whose UTF-16 order differs) goes through ``row_entry`` unchanged, so findings
    and reasons are exactly the general path's.
    """
    names = rb.schema.names
    col = {n: rb.column(i).to_pylist() for i, n in enumerate(names)}
    n = rb.num_rows
    none = [None] * n
    get = col.get
    out: list[CompactEntry] = []
    append = out.append
    interned: dict[str, str] = {}
    for i, (tid, sid, parent, ts, name, kind, start, end, sc, sm, text, da, de, dl,
            c_id, c_seq, c_prev, c_hash, c_ep) in enumerate(zip(
            col["trace_id"], col["span_id"], get("parent_span_id", none), get("trace_state", none), col["name"],
            col["kind"], col["start_time_unix_nano"], col["end_time_unix_nano"], get("status_code", none),
            get("status_message", none), col["attributes"], get("dropped_attributes_count", none),
            get("dropped_events_count", none), get("dropped_links_count", none), get("chain_id", none),
            get("chain_seq", none), get("chain_prev", none), get("chain_hash", none), get("chain_epoch", none))):
        try:
            a = _loads(text) if text else {}
            pop = a.pop
            # exactly the values _typed_scalar reads (a missing key or another shape: general path)
            cid = pop(_CHAIN_ID)["s"]
            t = pop(_CHAIN_SEQ)
            seq = int(t["i"]) if len(t) == 1 else None
            prev = pop(_CHAIN_PREV)["s"]
            hsh = pop(_CHAIN_HASH)["s"]
            t = pop(_CHAIN_EPOCH, None)
            ep = 0 if t is None else int(t["i"]) if len(t) == 1 else None
            if (type(cid) is str and type(seq) is int and type(prev) is str and type(hsh) is str
                    and type(ep) is int and (c_id, c_seq, c_prev, c_hash, c_ep or 0) == (cid, seq, prev, hsh, ep)):
                key = (tid, sid)
                evs = ev_by.get(key) if ev_by else None
                lks = lk_by.get(key) if lk_by else None
                # Column values as read (ints from an integer column): another type gives other
                # bytes, the hash check fails and the general path converts.
                leaf = _dumps({
                    "attributes": a,
                    "dropped_attributes_count": da or 0,
                    "dropped_events_count": de or 0,
                    "dropped_links_count": dl or 0,
                    "end_time_unix_nano": str(end),
                    "events": _fast_events(evs) if evs else [],
                    "kind": kind,
                    "links": _fast_links(lks) if lks else [],
                    "name": name,
                    "parent_span_id": parent or "",
                    "span_id": sid,
                    "start_time_unix_nano": str(start),
                    "status": {"code": sc or 0, "message": sm or ""},
                    "trace_id": tid,
                    "trace_state": ts or "",
                    "v": LEAF_VERSION,
                }, option=_SORTED)
                lh = leaf_hash(leaf)
                if link_from_leaf_hash(prev, lh) == hsh:
                    # one shared object per repeated value keeps the pickled result small
                    cid = interned.setdefault(cid, cid)
                    append((cid, ep, seq, prev, hsh, hsh, lh, sid, tid, None))
                    continue
        except Exception:  # noqa: BLE001, S110 - anything odd: the general path below decides
            pass
        row = {c: col[c][i] for c in names}
        key = (tid, sid)
        row["events"] = ev_by.get(key, []) if ev_by else []
        row["links"] = lk_by.get(key, []) if lk_by else []
        append(_compact(*row_entry(row)))
    return out


def _query(reader: Any, where: str, params: Sequence[Any]) -> tuple[Any, dict, dict]:
    p = list(params) or None
    spans = reader.query(f"SELECT {SPAN_COLS} FROM spans WHERE {where}", p)
    if spans.num_rows == 0:
        return spans, {}, {}
    sub = f"SELECT trace_id, span_id FROM spans WHERE {where}"
    ev_by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in _rows(reader.query(f"SELECT {EVENT_COLS} FROM span_events e SEMI JOIN ({sub}) s "
                                f"ON e.trace_id = s.trace_id AND e.span_id = s.span_id", p)):
        ev_by[(e["trace_id"], e["span_id"])].append(e)
    lk_by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for lk in _rows(reader.query(f"SELECT {LINK_COLS} FROM span_links l SEMI JOIN ({sub}) s "
                                 f"ON l.trace_id = s.trace_id AND l.span_id = s.span_id", p)):
        lk_by[(lk["trace_id"], lk["span_id"])].append(lk)
    return spans, dict(ev_by), dict(lk_by)


PARALLEL_MIN_ROWS = 200_000


def iter_entries(reader: Any, where: str, params: Sequence[Any], workers: int | None = None
                 ) -> Iterator[tuple[str, int, Entry]]:
    """``(chain_id, epoch, compact entry)`` per sealed row; large tapes use one process per core."""
    spans, ev_by, lk_by = _query(reader, where, params)
    if workers is None:
        # On two cores the parent's own share (entries, links, Merkle tree) plus two workers
        # oversubscribe the machine, and shipping the rows costs more than it saves: one process.
        cpus = os.cpu_count() or 1
        workers = min(cpus, 4) if cpus > 2 else 1
    if spans.num_rows < PARALLEL_MIN_ROWS or workers < 2:
        for rb in spans.to_batches(max_chunksize=65536):
            yield from map(_entry, _batch_entries(rb, ev_by, lk_by))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    def subset(rb: Any, by: dict) -> dict:
        if not by:
            return {}
        keys = zip(rb.column(0).to_pylist(), rb.column(1).to_pylist())
        return {k: by[k] for k in keys if k in by}

    batches = spans.to_batches(max_chunksize=max(20_000, spans.num_rows // (workers * 8)))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver")) as pool:
        futures = [pool.submit(_batch_entries, rb, subset(rb, ev_by), subset(rb, lk_by)) for rb in batches]
        for fut in futures:
            yield from map(_entry, fut.result())


def load_rows(reader: Any, where: str = "chain_id IS NOT NULL", params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    return list(iter_rows(reader, where, params))


def row_leaf(row: dict[str, Any]) -> bytes:
    """The canonical leaf of a row from ``load_rows``."""
    return leaf_bytes(project_row(row, row.get("events", ()), row.get("links", ())))


def _typed_scalar(t: Any) -> Any:
    if not isinstance(t, dict):
        return None
    if "s" in t:
        return t["s"]
    if "i" in t:
        try:
            return int(t["i"])
        except (TypeError, ValueError):
            return None
    return None


def row_entry(row: dict[str, Any]) -> tuple[str, int, Entry]:
    """``(chain_id, epoch, entry)`` of a sealed span row; chain fields are taken from ``attributes``."""
    attrs = row["attributes"]
    if isinstance(attrs, (str, bytes)):
        try:
            attrs = orjson.loads(attrs) if attrs else {}
        except orjson.JSONDecodeError:
            attrs = None
        row["attributes"] = attrs
    if not isinstance(attrs, dict):  # attributes that are not a JSON object: nothing to check them against
        entry = Entry(int(row.get("chain_seq") or 0), row.get("chain_prev"), row.get("chain_hash"), None,
                      row["span_id"], row["trace_id"], "content unreadable (attributes are not a JSON object)")
        return str(row.get("chain_id")), int(row.get("chain_epoch") or 0), entry
    problem = None
    chain_id = _typed_scalar(attrs.get(semconv.CHAIN_ID))
    seq = _typed_scalar(attrs.get(semconv.CHAIN_SEQ))
    prev = _typed_scalar(attrs.get(semconv.CHAIN_PREV))
    hsh = _typed_scalar(attrs.get(semconv.CHAIN_HASH))
    epoch = _typed_scalar(attrs.get(semconv.CHAIN_EPOCH)) or 0
    if chain_id is None or not isinstance(seq, int):
        problem = "chain attributes missing or malformed"
        chain_id = chain_id if isinstance(chain_id, str) else row.get("chain_id")
        seq = seq if isinstance(seq, int) else int(row.get("chain_seq") or 0)
    elif (row.get("chain_id"), row.get("chain_seq"), row.get("chain_prev"), row.get("chain_hash"),
          row.get("chain_epoch") or 0) != (chain_id, seq, prev, hsh, epoch):
        problem = "chain columns differ from the span's chain attributes"
    try:
        leaf: bytes | None = row_leaf(row)
    except Exception as exc:  # a row the projection cannot read is itself evidence of tampering
        leaf, problem = None, f"content unreadable ({type(exc).__name__})"
    entry = Entry(seq, prev if isinstance(prev, str) else None, hsh if isinstance(hsh, str) else None, leaf,
                  row["span_id"], row["trace_id"], problem)
    return str(chain_id), int(epoch), entry


def store_notes(reader: Any) -> list[tuple[str, str]]:
    """Checkpoint notes exported into the store (as spans or log records)."""
    out: list[tuple[str, str]] = []
    t = reader.query("SELECT attributes FROM spans WHERE name = ?", [semconv.EVENT_CHECKPOINT])
    for attrs in t.column(0).to_pylist():
        note = _typed_scalar(orjson.loads(attrs).get(semconv.CHECKPOINT_NOTE)) if attrs else None
        if isinstance(note, str):
            out.append((note, "store"))
    t = reader.query("SELECT body, attributes FROM log_records WHERE event_name = ?", [semconv.EVENT_CHECKPOINT])
    for body, attrs in zip(t.column(0).to_pylist(), t.column(1).to_pylist()):
        note = _typed_scalar(orjson.loads(attrs).get(semconv.CHECKPOINT_NOTE)) if attrs else None
        if note is None and body:
            note = _typed_scalar(orjson.loads(body))
        if isinstance(note, str):
            out.append((note, "store"))
    return out


def file_notes(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[str, str]]:
    return [(rec["note"], str(p)) for p in paths for rec in read_checkpoint_file(p)]


def verify_rows(
    rows: Iterable[dict[str, Any] | tuple[str, int, Entry]],
    checkpoints: Sequence[SignedCheckpoint] = (),
    key_pinned: bool = False,
    expect: Iterable[tuple[str, int]] = (),
    retained: dict[tuple[str, int], list[tuple[int, int, str]]] | None = None,
) -> list[ChainReport]:
    """Group sealed rows by tape, epoch and trace and verify each group (``expect``: tapes that must exist).

    A chain lives in one trace. The same tape id and epoch opened (seq 0) in several traces means
    several processes sealed it without a shared checkpoint file (a run id reused to resume, with no
    ``AGENTTAPE_CHECKPOINTS``): each trace's chain is verified on its own, with the checkpoints that
    name its entries (``assign_checkpoints``), and its report carries the trace id.
    """
    groups: dict[tuple[str, int], dict[str, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if isinstance(row, tuple):  # already an entry (iter_entries)
            chain_id, epoch, entry = row
        else:
            chain_id, epoch, entry = row_entry(row)
        groups[(chain_id, epoch)][entry.trace_id].append(entry.compact())
    for key in expect:
        groups.setdefault(key, defaultdict(list))
    reports = []
    for (cid, ep), by_trace in groups.items():
        starts = sum(1 for entries in by_trace.values() if any(e.seq == 0 for e in entries))
        if starts < 2:  # one chain (entries moved into another trace are checked against it)
            entries = [e for part in by_trace.values() for e in part]
            reports.append(verify_chain(cid, ep, entries, checkpoints, key_pinned,
                                        (retained or {}).get((cid, ep), ())))
            continue
        for tid, cps in assign_checkpoints(cid, ep, by_trace, checkpoints).items():
            report = verify_chain(cid, ep, by_trace[tid], cps, key_pinned)
            report.trace_id = tid
            reports.append(report)
    reports.sort(key=lambda r: (r.chain_id, r.epoch, r.trace_id or ""))
    return reports


def verify_store(
    reader: Any,
    *,
    run: str | None = None,
    verifiers: Sequence[Verifier] = (),
    checkpoint_files: Sequence[str | os.PathLike[str]] = (),
    workers: int | None = None,
) -> list[ChainReport]:
    """Verify every tape in the store (or the one holding ``run``); ``workers``: processes for big tapes."""
    where, params = _chain_filter(run)
    rows = iter_entries(reader, where, params, workers)
    notes = store_notes(reader) + file_notes(checkpoint_files)
    checkpoints = parse_notes(notes, verifiers)
    expect: list[tuple[str, int]] = []
    if run is not None:  # a tape a signed checkpoint knows but the store lost entirely
        for c in checkpoints:
            try:
                cid, ep = parse_origin(c.checkpoint.origin)
            except ValueError:
                continue
            if cid == run and c.trusted is not False and c.checkpoint.size > 0:
                expect.append((cid, ep))
    lakes = getattr(reader, "lakes", None)  # a lake reader: what its recorded retention removed
    retained = lakes.retained_ranges() if lakes is not None else None
    with _gc_paused():  # a million acyclic entries: collections would only re-scan them
        return verify_rows(rows, checkpoints, key_pinned=bool(verifiers), expect=expect, retained=retained)


def _names_own_head(cp: Any, entries: dict[int, Entry]) -> bool:
    """Whether a checkpoint's chain head is this chain's entry at ``size - 1`` (or it names none)."""
    head = cp.chain_head
    if head is None:
        return True
    e = entries.get(cp.size - 1)
    return e is not None and e.hash == head


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# --- proofs -------------------------------------------------------------------------------------------


class ProveError(Exception):
    """The span cannot be proven (not sealed, no covering checkpoint, tape does not verify)."""


def prove_span(
    reader: Any,
    span_id: str,
    *,
    verifiers: Sequence[Verifier] = (),
    checkpoint_files: Sequence[str | os.PathLike[str]] = (),
) -> dict[str, Any]:
    """A self-contained proof (leaf, inclusion proof, signed checkpoint) for one sealed span."""
    from otel_agenttape.integrity.merkle import CompactRange, leaf_hash
    from otel_agenttape.integrity.proof import build_proof

    span_id = span_id.lower()
    found = load_rows(reader, "span_id = ? AND chain_id IS NOT NULL", [span_id])
    if not found:
        raise ProveError(f"no sealed span {span_id} in the store")
    chain_id, epoch, target = row_entry(found[0])
    if target.problem or target.leaf is None:
        raise ProveError(f"span {span_id} does not verify: {target.problem}")
    entries = {}
    for row in load_rows(reader, "chain_id = ?", [chain_id]):
        cid, ep, e = row_entry(row)
        if (cid, ep, e.trace_id) == (chain_id, epoch, target.trace_id):  # a chain lives in one trace
            entries[e.seq] = e
    checkpoints = parse_notes(store_notes(reader) + file_notes(checkpoint_files), verifiers)
    candidates = sorted(
        (c for c in checkpoints
         if c.trusted is not False and c.checkpoint.size > target.seq
         and parse_origin(c.checkpoint.origin) == (chain_id, epoch) and _names_own_head(c.checkpoint, entries)),
        key=lambda c: c.checkpoint.size,
    )
    if not candidates:
        raise ProveError(f"no signed checkpoint of tape {chain_id} covers seq {target.seq} yet")
    leaves: list[bytes] = []
    cr = CompactRange()
    for c in candidates:
        size = c.checkpoint.size
        while len(leaves) < size:
            e = entries.get(len(leaves))
            if e is None or e.leaf is None:
                raise ProveError(f"tape {chain_id} is missing seq {len(leaves)}: cannot rebuild the tree")
            leaves.append(e.leaf)
            cr.append(leaf_hash(e.leaf))
        if cr.root() == c.checkpoint.root:
            return build_proof(chain_id, epoch, target.seq, leaves[:size], c.note)
    raise ProveError(f"the stored tape {chain_id} does not match its signed checkpoints (run agenttape verify)")
