"""The fast path to the chain entries of sealed rows, beside the reference ``sealed_rows.row_entry``.

``batch_entries`` serializes a leaf straight from the stored typed JSON and keeps it only when it
reproduces the stored chain hash (a leaf v2 row has its salted values committed and its erased ones
entered first, ``_commit``); every other row takes ``row_entry``, so findings are the reference
path's (``tests/test_integrity_fastpath.py`` holds both equal). ``iter_entries`` runs it over a tape,
in one process per core for large tapes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from otel_agenttape import native, semconv
from otel_agenttape.integrity import chain as _chain
from otel_agenttape.integrity.chain import link_from_leaf_hash, sha256_digest
from otel_agenttape.integrity.leaf import LEAF_V1, LEAF_VERSION, split_label
from otel_agenttape.integrity.merkle import leaf_hash
from otel_agenttape.integrity.verify import Entry
from otel_agenttape.tape.sealed_rows import (
    CompactEntry,
    from_compact,
    query_row_batches,
    query_rows,
    row_entry,
    to_compact,
)

_CHAIN_ID, _CHAIN_SEQ, _CHAIN_PREV, _CHAIN_HASH, _CHAIN_EPOCH = (
    semconv.CHAIN_ID, semconv.CHAIN_SEQ, semconv.CHAIN_PREV, semconv.CHAIN_HASH, semconv.CHAIN_EPOCH)
_loads = orjson.loads
_dumps = orjson.dumps
_SORTED = orjson.OPT_SORT_KEYS
_SALTS, _ERASED = semconv.CHAIN_SALTS, semconv.CHAIN_ERASED
_fromhex = bytes.fromhex
_native_sha256 = _chain._native_sha256  # libcrypto called directly (None where not built)
# the compiled twin of the salts loop below (integrity/_chain.pyx), where built
_native_commit = getattr(_chain._native, "commit_salts", None) if _chain._native is not None else None
_HEX = frozenset("0123456789abcdef")
# the compiled twin of the fast path below (tape/_sealed_entries.pyx): each row's leaf hashed as it is read
_streamed = native.load("otel_agenttape.tape._sealed_entries")
if _streamed is not None and not _streamed.available():
    _streamed = None


class _General(Exception):
    """A commitment map the fast path does not take: the general path decides."""


_LABELS: dict[str, tuple[int | None, str]] = {}


def _label(label: str) -> tuple[int | None, str]:
    r = split_label(label)
    if len(_LABELS) < 4096:  # only a cache: the same few labels recur on every row
        _LABELS[label] = r
    return r


def _commit(a: dict[str, Any], events: list[dict[str, Any]], st: Any, er: Any) -> None:
    """Leaf v2 on the stored typed sets, as ``leaf.apply_commitments`` does it: each salted value
    replaced by ``{"c": sha256(salt || its bytes)}``, each erased one entered as its commitment.

    Only well-formed maps are taken (anything ``apply_commitments`` would refuse raises), so a row it
    accepts is one the reference path accepts with the same leaf."""
    if er is None and _native_commit is not None:  # the common row: salts, nothing erased
        done = _native_commit(a, events, st["s"], _LABELS, _label)
        if done:
            return
        if done is False:
            raise _General
    salts = _loads(st["s"]) if st is not None else {}
    erased = _loads(er["s"]) if er is not None else {}
    if type(salts) is not dict or type(erased) is not dict:
        raise _General
    for label, h in salts.items():
        if type(h) is not str or len(h) != 32 or label in erased:
            raise _General
        salt = _fromhex(h)
        if len(salt) != 16 or not (h.islower() or h.isdigit()):  # spaces, upper case: the reference refuses them
            raise _General
        idx, key = _LABELS.get(label) or _label(label)
        t = a if idx is None else events[idx]["attributes"]
        data = salt + _dumps(t[key], option=_SORTED)
        d = _native_sha256(data) if _native_sha256 is not None else None
        t[key] = {"c": (d if d is not None else sha256_digest(data)).hex()}
    for label, c in erased.items():
        if type(c) is not str or len(c) != 64 or not _HEX.issuperset(c):
            raise _General
        idx, key = _LABELS.get(label) or _label(label)
        t = a if idx is None else events[idx]["attributes"]
        if key in t:
            raise _General
        t[key] = {"c": c}


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


def batch_entries(rb: Any, ev_by: dict, lk_by: dict) -> list[CompactEntry]:
    """Compact entries of one record batch (runs in a worker process for large tapes).

    The fast path serializes the leaf straight from the stored typed JSON (already the leaf's typed
    form, kept in key order by the store; orjson re-sorts by code point) and accepts it only when it
    reproduces the stored chain hash: then it is, byte for byte, the leaf that was sealed, which is
    also what the general projection gives. Any other row (edited, malformed, chain fields missing or
    disagreeing, keys whose UTF-16 order differs) goes through ``row_entry`` unchanged, so findings
    and reasons are exactly the general path's.
    """
    names = rb.schema.names
    n = rb.num_rows
    streamed = None
    if _streamed is not None and "attributes" in names:  # the compiled twin reads the texts in place
        at = names.index("attributes")
        col = {c: rb.column(i).to_pylist() for i, c in enumerate(names) if i != at}
        texts = rb.column(at)
        if not hasattr(texts, "buffers"):  # a table's chunked column: one array
            texts = texts.combine_chunks()
        streamed, left = _streamed.batch(col, n, ev_by, lk_by, texts)
        if not left:
            return streamed
        col["attributes"] = rb.column(at).to_pylist()
    else:
        col = {c: rb.column(i).to_pylist() for i, c in enumerate(names)}
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
        if streamed is not None:
            done = streamed[i]
            if done is not None:  # hashed as read (the compiled twin of what follows)
                append(done)
                continue
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
                events = _fast_events(evs) if evs else []
                st = pop(_SALTS, None)
                er = pop(_ERASED, None)
                v = LEAF_V1
                if st is not None or er is not None:
                    _commit(a, events, st, er)
                    v = LEAF_VERSION
                # Column values as read (ints from an integer column): another type gives other
                # bytes, the hash check fails and the general path converts.
                leaf = _dumps({
                    "attributes": a,
                    "dropped_attributes_count": da or 0,
                    "dropped_events_count": de or 0,
                    "dropped_links_count": dl or 0,
                    "end_time_unix_nano": str(end),
                    "events": events,
                    "kind": kind,
                    "links": _fast_links(lks) if lks else [],
                    "name": name,
                    "parent_span_id": parent or "",
                    "span_id": sid,
                    "start_time_unix_nano": str(start),
                    "status": {"code": sc or 0, "message": sm or ""},
                    "trace_id": tid,
                    "trace_state": ts or "",
                    "v": v,
                }, option=_SORTED)
                lh = leaf_hash(leaf)
                if link_from_leaf_hash(prev, lh) == hsh:
                    # one shared object per repeated value keeps the pickled result small
                    cid = interned.setdefault(cid, cid)
                    append((cid, ep, seq, prev, hsh, hsh, lh, sid, tid, None,
                            _loads(er["s"]) if er is not None else None))
                    continue
        except Exception:  # noqa: BLE001, S110 - anything odd: the general path below decides
            pass
        row = {c: col[c][i] for c in names}
        key = (tid, sid)
        row["events"] = ev_by.get(key, []) if ev_by else []
        row["links"] = lk_by.get(key, []) if lk_by else []
        append(to_compact(*row_entry(row)))
    return out


PARALLEL_MIN_ROWS = 200_000


def iter_entries(reader: Any, where: str, params: Sequence[Any], workers: int | None = None
                 ) -> Iterator[tuple[str, int, Entry]]:
    """``(chain_id, epoch, compact entry)`` per sealed row; large tapes use one process per core.

    In one process the spans are streamed from the store a batch at a time (a million-span tape's rows
    are never all in memory at once)."""
    if workers is None:
        # On two cores the parent's own share (entries, links, Merkle tree) plus two workers
        # oversubscribe the machine, and shipping the rows costs more than it saves: one process.
        cpus = os.cpu_count() or 1
        workers = min(cpus, 4) if cpus > 2 else 1
    if workers < 2:
        batches, ev_by, lk_by = query_row_batches(reader, where, params)
        for rb in batches:
            yield from map(from_compact, batch_entries(rb, ev_by, lk_by))
        return
    spans, ev_by, lk_by = query_rows(reader, where, params)
    if spans.num_rows < PARALLEL_MIN_ROWS:
        for rb in spans.to_batches(max_chunksize=65536):
            yield from map(from_compact, batch_entries(rb, ev_by, lk_by))
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
        futures = [pool.submit(batch_entries, rb, subset(rb, ev_by), subset(rb, lk_by)) for rb in batches]
        for fut in futures:
            yield from map(from_compact, fut.result())
