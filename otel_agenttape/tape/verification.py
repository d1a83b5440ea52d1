"""Verify sealed tapes from the store (DuckDB file, Parquet lake, or OTLP files loaded in memory).

Every leaf is recomputed from the stored ``spans`` / ``span_events`` / ``span_links`` rows; the
stored chain fields are read from the typed ``attributes`` (the truth) and compared with the
promoted ``chain_*`` columns. Checkpoints come from ``agenttape.checkpoint`` spans or log records
in the store and from local checkpoint files; with a pinned key only the checkpoints it signed count.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import orjson

from otel_agenttape import semconv
from otel_agenttape.integrity.checkpoint import parse_origin, read_checkpoint_file
from otel_agenttape.integrity.leaf import leaf_bytes, project_row
from otel_agenttape.integrity.note import Verifier
from otel_agenttape.integrity.verify import (
    ChainReport,
    Entry,
    SignedCheckpoint,
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


def _batch_entries(rb: Any, ev_by: dict, lk_by: dict) -> list[tuple[str, int, Entry]]:
    """Compact entries of one record batch (runs in a worker process for large tapes)."""
    out = []
    for row in _batch_rows(rb, ev_by, lk_by):
        cid, ep, e = row_entry(row)
        out.append((cid, ep, e.compact()))
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
    workers = workers if workers is not None else min(os.cpu_count() or 1, 4)
    if spans.num_rows < PARALLEL_MIN_ROWS or workers < 2:
        for rb in spans.to_batches(max_chunksize=65536):
            yield from _batch_entries(rb, ev_by, lk_by)
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
            yield from fut.result()


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
        attrs = orjson.loads(attrs) if attrs else {}
        row["attributes"] = attrs
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
) -> list[ChainReport]:
    """Group sealed rows by tape and epoch and verify each group (``expect``: tapes that must exist)."""
    groups: dict[tuple[str, int], list[Entry]] = defaultdict(list)
    for row in rows:
        if isinstance(row, tuple):  # already an entry (iter_entries)
            chain_id, epoch, entry = row
        else:
            chain_id, epoch, entry = row_entry(row)
        groups[(chain_id, epoch)].append(entry.compact())
    for key in expect:
        groups.setdefault(key, [])
    reports = [verify_chain(cid, ep, entries, checkpoints, key_pinned) for (cid, ep), entries in groups.items()]
    reports.sort(key=lambda r: (r.chain_id, r.epoch))
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
    return verify_rows(rows, checkpoints, key_pinned=bool(verifiers), expect=expect)


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
        if (cid, ep) == (chain_id, epoch):
            entries[e.seq] = e
    checkpoints = parse_notes(store_notes(reader) + file_notes(checkpoint_files), verifiers)
    candidates = sorted(
        (c for c in checkpoints
         if c.trusted is not False and c.checkpoint.size > target.seq
         and parse_origin(c.checkpoint.origin) == (chain_id, epoch)),
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


# --- command line ---------------------------------------------------------------------------------------


def _verifiers(keys: Sequence[str] | None) -> list[Verifier]:
    out = []
    for k in keys or ():
        text = k
        if os.path.exists(k):
            with open(k, encoding="utf-8") as fh:
                text = fh.read().strip()
        out.append(Verifier.parse(text))
    return out


def _open(args: Any) -> Any:
    from otel_agenttape.cli import CliError
    from otel_agenttape.tape.sources import SourceError, open_source

    try:
        return open_source(args.db, args.parquet, args.otlp)
    except SourceError as exc:
        raise CliError(str(exc)) from None


def _keys(args: Any) -> list[Verifier]:
    from otel_agenttape.cli import CliError
    from otel_agenttape.integrity.note import NoteError

    try:
        return _verifiers(args.key)
    except (OSError, NoteError) as exc:
        raise CliError(f"bad --key: {exc}") from None


def cmd_verify(args: Any) -> int:
    """``agenttape verify``: exit 0 when every tape verifies, 1 otherwise."""
    import sys

    from otel_agenttape.cli import CliError

    verifiers = _keys(args)
    for path in args.checkpoints or ():
        if not os.path.exists(path):
            raise CliError(f"no checkpoint file {path}")
    reader = _open(args)
    try:
        reports = verify_store(reader, run=args.run, verifiers=verifiers, checkpoint_files=args.checkpoints or ())
    finally:
        reader.close()
    ok = bool(reports) and all(r.valid for r in reports)
    if args.json:
        doc = {"valid": ok, "chains": [r.to_json() for r in reports]}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0 if ok else 1
    if not reports:
        print("no sealed tapes found" + (f" for run {args.run}" if args.run else ""))
        return 1
    for r in reports:
        epoch = f" epoch {r.epoch}" if r.epoch else ""
        signed = f", signed up to {r.signed_size}" if r.key_pinned else ""
        if r.valid:
            print(f"ok    {r.chain_id}{epoch}: {r.length} entries{signed}")
        else:
            print(f"FAIL  {r.chain_id}{epoch}: {r.length} entries, first broken index {r.first_broken_index}: {r.reason}")
            for issue in r.issues[1:6]:
                print(f"        also at {issue.index}: {issue.reason}")
        if r.restored_from:
            print(f"        restored epoch; previous checkpoint: {r.restored_from}")
    if not verifiers:
        print("note: no --key given: checkpoint signatures were not checked against a trusted key")
    return 0 if ok else 1


def cmd_prove(args: Any) -> int:
    """``agenttape prove SPAN_ID --out FILE``."""
    from otel_agenttape.cli import CliError

    verifiers = _keys(args)
    reader = _open(args)
    try:
        proof = prove_span(reader, args.span_id, verifiers=verifiers, checkpoint_files=args.checkpoints or ())
    except ProveError as exc:
        print(f"agenttape: cannot prove: {exc}")
        return 1
    finally:
        reader.close()
    try:
        with open(args.out, "wb") as fh:
            fh.write(orjson.dumps(proof, option=orjson.OPT_INDENT_2) + b"\n")
    except OSError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote proof of span {proof['span_id']} (seq {proof['index']} of {proof['tree_size']} "
          f"in tape {proof['chain_id']}) to {args.out}")
    return 0


def cmd_verify_proof(args: Any) -> int:
    """``agenttape verify-proof FILE --key PUB``: checks offline, exit 0 or 1."""
    from otel_agenttape.cli import CliError
    from otel_agenttape.integrity.proof import ProofInvalid, verify_proof

    verifiers = _keys(args)
    if not verifiers:
        raise CliError("verify-proof needs --key (the signer's public key)")
    try:
        with open(args.file, "rb") as fh:
            doc = orjson.loads(fh.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise CliError(f"cannot read proof {args.file}: {exc}") from None
    try:
        res = verify_proof(doc, verifiers)
    except ProofInvalid as exc:
        if args.json:
            print(orjson.dumps({"valid": False, "reason": str(exc)}).decode())
        else:
            print(f"INVALID proof: {exc}")
        return 1
    if args.json:
        print(orjson.dumps({"valid": True, "chain_id": res.chain_id, "epoch": res.epoch, "index": res.index,
                            "tree_size": res.tree_size, "span_id": res.span_id,
                            "signed_by": list(res.signed_by)}).decode())
    else:
        print(f"ok: span {res.span_id} is entry {res.index} of {res.tree_size} in tape {res.chain_id}, "
              f"signed by {', '.join(res.signed_by)}")
    return 0


def cmd_keygen(args: Any) -> int:
    """``agenttape keygen``: an Ed25519 signing key for checkpoints (PREFIX.key, PREFIX.pub)."""
    import socket

    from otel_agenttape.cli import CliError
    from otel_agenttape.integrity.note import NoteError, Signer

    name = args.name or "agenttape." + "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.") or "agenttape"
    try:
        signer = Signer.generate(name)
    except NoteError as exc:
        raise CliError(str(exc)) from None
    key_path, pub_path = args.out + ".key", args.out + ".pub"
    for p in (key_path, pub_path):
        if os.path.exists(p) and not args.force:
            raise CliError(f"{p} exists (use --force to replace it)")
    try:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(signer.skey() + "\n")
        os.chmod(key_path, 0o600)
        with open(pub_path, "w", encoding="utf-8") as fh:
            fh.write(signer.verifier().vkey() + "\n")
    except OSError as exc:
        raise CliError(str(exc)) from None
    print(f"signing key: {key_path} (keep it secret; AGENTTAPE_SIGNING_KEY={key_path})")
    print(f"public key:  {pub_path}")
    print(signer.verifier().vkey())
    return 0
