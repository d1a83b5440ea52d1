"""Verify sealed tapes from the store (DuckDB file, Parquet lake, or OTLP files loaded in memory).

Every leaf is recomputed from the stored ``spans`` / ``span_events`` / ``span_links`` rows
(``sealed_rows.py``, and its fast path ``sealed_entries.py``), and the log records sealed into spans
from ``log_records`` (``sealed_logs.py``); the stored chain fields are read from the
typed ``attributes`` (the truth) and compared with the promoted ``chain_*`` columns. Checkpoints come
from ``agenttape.checkpoint`` spans or log records in the store and from local checkpoint files; with a
pinned key only the checkpoints it signed count. Inclusion proofs of single spans: ``proofs.py``.
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
from otel_agenttape.integrity.checkpoint import parse_origin, read_checkpoint_file
from otel_agenttape.integrity.erasure import CheckedRecord, check_erased, check_record
from otel_agenttape.integrity.note import Verifier
from otel_agenttape.integrity.verify import (
    TAMPER,
    ChainReport,
    Entry,
    Issue,
    SignedCheckpoint,
    add_issues,
    assign_checkpoints,
    parse_notes,
    verify_chain,
)
from otel_agenttape.store.retention import retained_ranges, store_records
from otel_agenttape.tape.sealed_entries import iter_entries
from otel_agenttape.tape.sealed_logs import log_issues
from otel_agenttape.tape.sealed_rows import row_entry, typed_scalar


def _chain_filter(run: str | None) -> tuple[str, list[Any]]:
    if run is None:
        return "chain_id IS NOT NULL", []
    return "chain_id IN (SELECT DISTINCT chain_id FROM spans WHERE chain_id = ? OR run_id = ?)", [run, run]


def store_notes(reader: Any) -> list[tuple[str, str]]:
    """Checkpoint notes exported into the store (as spans or log records)."""
    out: list[tuple[str, str]] = []
    t = reader.query("SELECT attributes FROM spans WHERE name = ?", [semconv.EVENT_CHECKPOINT])
    for attrs in t.column(0).to_pylist():
        note = typed_scalar(orjson.loads(attrs).get(semconv.CHECKPOINT_NOTE)) if attrs else None
        if isinstance(note, str):
            out.append((note, "store"))
    t = reader.query("SELECT body, attributes FROM log_records WHERE event_name = ?", [semconv.EVENT_CHECKPOINT])
    for body, attrs in zip(t.column(0).to_pylist(), t.column(1).to_pylist()):
        note = typed_scalar(orjson.loads(attrs).get(semconv.CHECKPOINT_NOTE)) if attrs else None
        if note is None and body:
            note = typed_scalar(orjson.loads(body))
        if isinstance(note, str):
            out.append((note, "store"))
    return out


def store_erasures(reader: Any, verifiers: Sequence[Verifier] = ()) -> list[CheckedRecord]:
    """The erasure records in the store (``agenttape.erasure`` spans), each with its note checked."""
    t = reader.query("SELECT attributes FROM spans WHERE name = ?", [semconv.EVENT_ERASURE])
    out = []
    for attrs in t.column(0).to_pylist():
        a = orjson.loads(attrs) if attrs else {}
        rec, note, vkey = (typed_scalar(a.get(k)) for k in (semconv.ERASURE_RECORD, semconv.ERASURE_NOTE,
                                                            semconv.ERASURE_KEY))
        if not isinstance(rec, str) or not isinstance(note, str):
            continue
        out.append(check_record(rec, note, vkey if isinstance(vkey, str) else None, verifiers))
    return out


def file_notes(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[str, str]]:
    return [(rec["note"], str(p)) for p in paths for rec in read_checkpoint_file(p)]


def verify_rows(
    rows: Iterable[dict[str, Any] | tuple[str, int, Entry]],
    checkpoints: Sequence[SignedCheckpoint] = (),
    key_pinned: bool = False,
    expect: Iterable[tuple[str, int]] = (),
    retained: dict[tuple[str, int], list[tuple[int, int, str]]] | None = None,
    erasures: Sequence[CheckedRecord] = (),
    log_erased: Sequence[tuple[str, int, int, str, str, dict[str, str]]] = (),
) -> list[ChainReport]:
    """Group sealed rows by tape, epoch and trace and verify each group (``expect``: tapes that must exist).

    A chain lives in one trace. The same tape id and epoch opened (seq 0) in several traces means
    several processes sealed it without a shared checkpoint file (a run id reused to resume, with no
    ``AGENTTAPE_CHECKPOINTS``): each trace's chain is verified on its own, with the checkpoints that
    name its entries (``assign_checkpoints``), and its report carries the trace id.

    Values erased from leaf v2 spans must be named by one of ``erasures`` that counts (valid, and
    signed by a pinned key when keys are pinned): otherwise each is a finding at its span's seq.
    ``log_erased``: the values erased from log records sealed into spans (``sealed_logs``), checked the same way.
    """
    groups: dict[tuple[str, int], dict[str, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    erased: list[tuple[str, int, int, str, str, dict[str, str]]] = []
    for row in rows:
        if isinstance(row, tuple):  # already an entry (iter_entries)
            chain_id, epoch, entry = row
        else:
            chain_id, epoch, entry = row_entry(row)
        if entry.erased:
            erased.append((chain_id, epoch, entry.seq, entry.trace_id, entry.span_id, entry.erased))
        groups[(chain_id, epoch)][entry.trace_id].append(entry.compact())
    if log_erased:  # one entry per span: its own erased values and its log records'
        at = {(c, ep, seq, tid, sid): i for i, (c, ep, seq, tid, sid, _) in enumerate(erased)}
        for c, ep, seq, tid, sid, m in log_erased:
            i = at.get((c, ep, seq, tid, sid))
            if i is None:
                erased.append((c, ep, seq, tid, sid, dict(m)))
            else:
                erased[i] = (*erased[i][:5], {**erased[i][5], **m})
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
    if erased or erasures:
        _apply_erasures(reports, erased, erasures)
    return reports


def _apply_erasures(reports: list[ChainReport], erased: list, erasures: Sequence[CheckedRecord]) -> None:
    findings, summaries = check_erased(erased, erasures)
    by_chain: dict[tuple[str, int], list[Issue]] = defaultdict(list)
    for f in findings:
        by_chain[(f.chain_id, f.epoch)].append(Issue(f.seq, TAMPER, f.reason))
    for r in reports:
        s = summaries.get((r.chain_id, r.epoch))
        if s is not None:
            r.erased_spans, r.erased_values = s.spans, s.values
            r.erasures = [{"id": k, "date": v} for k, v in sorted(s.records.items())]
        add_issues(r, by_chain.get((r.chain_id, r.epoch), ()))


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
    kept = retained_ranges(store_records(reader))  # a DuckDB store's own retention (``agenttape retain``)
    if kept:
        retained = dict(retained or {})
        for k, v in kept.items():
            retained[k] = [*retained.get(k, []), *v]
    logs = log_issues(reader, where, params)
    with _gc_paused():  # a million acyclic entries: collections would only re-scan them
        reports = verify_rows(rows, checkpoints, key_pinned=bool(verifiers), expect=expect, retained=retained,
                              erasures=store_erasures(reader, verifiers), log_erased=logs.erased)
    _apply_log_issues(reports, logs.issues)
    return reports


def _apply_log_issues(reports: list[ChainReport], found: dict[tuple[str, int, str], list[Issue]]) -> None:
    """Add the findings on log records sealed into spans (``sealed_logs``) to their tapes' reports."""
    if not found:
        return
    for r in reports:
        extra = [i for (cid, ep, tid), issues in found.items()
                 if cid == r.chain_id and ep == r.epoch and (r.trace_id is None or r.trace_id == tid) for i in issues]
        add_issues(r, extra)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
