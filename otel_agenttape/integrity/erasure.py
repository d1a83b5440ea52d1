"""Verifiable erasure of leaf v2 content values, and the signed erasure record (``docs/integrity.md``).

A leaf v2 holds each content value as ``sha256(salt || value)``. Erasing a value removes the value
and its salt from the stored span and keeps the commitment in ``agenttape.chain.erased``: the leaf,
and with it the chain, the Merkle tree and every checkpoint, are unchanged, while nothing left can
recover the value. ``erase_span`` does that on a span's stored typed attributes.

An erasure record says which values of which spans were erased, when, why and by whom (never the
content; the commitments it lists are salted hashes whose salts are gone). It is sealed like a
checkpoint: its RFC 8785 bytes are hashed into a C2SP signed note, so editing the record or forging
one breaks the signature. ``check_erased`` compares the erased maps found in a store with the
records: a value erased without a (valid, trusted) record naming it is a finding.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from otel_agenttape import semconv
from otel_agenttape.integrity.jcs import dumps, sorted_keys
from otel_agenttape.integrity.leaf import (
    CommitmentError,
    canonical_typed,
    commitment_hex,
    parse_erased,
    parse_salts,
    split_label,
)
from otel_agenttape.integrity.note import NoteError, Signer, Verifier, open_note, sign_note, split_note

RECORD_FORMAT = "agenttape-erasure/v1"
NOTE_ORIGIN = "agenttape.dev/erasure"
_SALTS, _ERASED = semconv.CHAIN_SALTS, semconv.CHAIN_ERASED


class ErasureError(ValueError):
    """A record or note that is malformed, or does not match."""


# --- one span -----------------------------------------------------------------------------------


@dataclass
class ErasedSpan:
    """What ``erase_span`` did: the new typed attribute sets and the commitments it entered."""

    attributes: dict[str, Any]
    events: list[dict[str, Any]]  # every event's typed attributes, in event order
    erased: dict[str, str]  # label -> commitment, the values erased now
    changed_events: list[int] = field(default_factory=list)


def erase_span(attributes: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
               labels: Iterable[str] | None = None) -> ErasedSpan:
    """Erase the salted values of a stored span (``labels``: only these; default all salted ones).

    ``attributes`` and ``events`` are the typed attribute sets as stored. Each erased value and its
    salt go; its commitment joins ``agenttape.chain.erased``. Raises ``CommitmentError`` for salts that
    do not fit the span (such a span does not verify either: nothing is erased then)."""
    attrs = dict(attributes)
    evs = [dict(e) for e in events]
    st = attrs.get(_SALTS)
    salts = parse_salts(st["s"] if isinstance(st, dict) else st) if st is not None else {}
    er = attrs.get(_ERASED)
    erased_before = parse_erased(er["s"] if isinstance(er, dict) else er) if er is not None else {}
    wanted = set(salts) if labels is None else set(labels) & set(salts)
    now: dict[str, str] = {}
    changed: set[int] = set()
    for label in sorted(wanted):
        idx, key = split_label(label)
        if idx is not None and idx >= len(evs):
            raise CommitmentError(f"{label!r} names event {idx}, the span has {len(evs)}")
        target = attrs if idx is None else evs[idx]
        if key not in target:
            raise CommitmentError(f"salt for a missing value {label!r}")
        now[label] = commitment_hex(salts.pop(label), canonical_typed(target.pop(key)))
        if idx is not None:
            changed.add(idx)
    if now:
        if salts:
            attrs[_SALTS] = {"s": orjson.dumps(salts_hex(salts)).decode()}
        else:
            attrs.pop(_SALTS, None)
        attrs[_ERASED] = {"s": orjson.dumps({**erased_before, **now}).decode()}
    return ErasedSpan(attrs, evs, now, sorted(changed))


def salts_hex(salts: Mapping[str, bytes]) -> dict[str, str]:
    return {k: v.hex() for k, v in salts.items()}


# --- the record ---------------------------------------------------------------------------------


def new_erasure_id() -> str:
    return "e-" + os.urandom(8).hex()


def build_record(spans: Sequence[Mapping[str, Any]], *, reason: str, by: str, selector: Mapping[str, Any],
                 time_unix_nano: int, erasure_id: str | None = None) -> dict[str, Any]:
    """An erasure record: ``spans`` is ``[{trace_id, span_id, chain_id, epoch, seq, erased: {label: c}}]``."""
    if not reason or not reason.strip():
        raise ErasureError("an erasure needs a reason")
    return {
        "format": RECORD_FORMAT,
        "id": erasure_id or new_erasure_id(),
        "time_unix_nano": str(int(time_unix_nano)),
        "reason": reason,
        "by": by,
        "selector": dict(selector),
        "spans": [dict(s) for s in spans],
        "values": sum(len(s["erased"]) for s in spans),
    }


def record_digest(record: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the record's RFC 8785 bytes."""
    return hashlib.sha256(dumps(dict(record))).hexdigest()


def note_text(record: Mapping[str, Any]) -> str:
    return (f"{NOTE_ORIGIN}\n{record['id']}\n{len(record['spans'])} {record['values']}\n"
            f"sha256 {record_digest(record)}\n")


def sign_record(record: Mapping[str, Any], signer: Signer) -> str:
    """The signed note that seals ``record``."""
    return sign_note(note_text(record), [signer])


@dataclass
class CheckedRecord:
    record: dict[str, Any]
    valid: bool  # the note matches the record and its signature verifies
    trusted: bool | None  # True: a pinned key signed it; False: none did; None: no key pinned
    problem: str | None = None

    @property
    def counts(self) -> bool:
        """Whether its erasures are accepted: valid, and signed by a pinned key when keys are pinned."""
        return self.valid and self.trusted is not False


def check_record(record_text: str, note: str, vkey: str | None, verifiers: Sequence[Verifier]) -> CheckedRecord:
    """Parse a stored record and check its note: the digest, then the signature (by a pinned key
    when ``verifiers`` are given, else by the key stored beside it)."""
    try:
        record = orjson.loads(record_text)
    except orjson.JSONDecodeError:
        return CheckedRecord({}, False, None, "erasure record is not JSON")
    if type(record) is not dict or record.get("format") != RECORD_FORMAT or not isinstance(record.get("spans"), list):
        return CheckedRecord(record if type(record) is dict else {}, False, None, "malformed erasure record")
    rid = record.get("id")
    try:
        text, _ = split_note(note)
        if text != note_text(record):
            return CheckedRecord(record, False, None, f"erasure {rid}: its signed note does not match the record")
        if verifiers:
            try:
                open_note(note, verifiers)
                return CheckedRecord(record, True, True)
            except NoteError:
                return CheckedRecord(record, True, False, f"erasure {rid} is not signed by a trusted key")
        if vkey is None:
            return CheckedRecord(record, False, None, f"erasure {rid} has no key to check its signature")
        open_note(note, [Verifier.parse(vkey)])
        return CheckedRecord(record, True, None)
    except (NoteError, ValueError, KeyError, TypeError) as exc:
        return CheckedRecord(record, False, None, f"erasure {rid}: signature does not verify ({exc})")


@dataclass
class ErasureFinding:
    chain_id: str
    epoch: int
    seq: int
    reason: str


@dataclass
class ErasureSummary:
    """Per tape: erased spans and values, and the records that account for them."""

    spans: int = 0
    values: int = 0
    records: dict[str, str] = field(default_factory=dict)  # erasure id -> ISO date


def check_erased(found: Iterable[tuple[str, int, int, str, str, Mapping[str, str]]],
                 records: Sequence[CheckedRecord]) -> tuple[list[ErasureFinding], dict[tuple[str, int], ErasureSummary]]:
    """Match erased maps found in a store (``(chain_id, epoch, seq, trace_id, span_id, {label: c})``)
    with the records. Every erased value must be named, with the same commitment, by a record that
    counts; anything else is a finding at the span's seq. Records that do not count are findings at
    each span they name."""
    named: dict[tuple[str, str, str], tuple[str, str]] = {}  # (trace, span, label) -> (commitment, id)
    findings: list[ErasureFinding] = []
    dates: dict[str, str] = {}
    for r in records:
        rec = r.record
        rid = str(rec.get("id"))
        for s in rec.get("spans", ()):
            if not isinstance(s, dict):
                continue
            if not r.counts:
                try:
                    findings.append(ErasureFinding(str(s["chain_id"]), int(s["epoch"]), int(s["seq"]),
                                                   f"seq {int(s['seq'])}: {r.problem}"))
                except (KeyError, TypeError, ValueError):
                    pass
                continue
            for label, c in (s.get("erased") or {}).items():
                named[(str(s.get("trace_id")), str(s.get("span_id")), label)] = (c, rid)
        if r.counts:
            dates[rid] = _iso(rec.get("time_unix_nano"))
    summaries: dict[tuple[str, int], ErasureSummary] = {}
    for chain_id, epoch, seq, trace_id, span_id, erased in found:
        summ = summaries.setdefault((chain_id, epoch), ErasureSummary())
        summ.spans += 1
        for label in sorted_keys(erased):
            got = named.get((trace_id, span_id, label))
            if got is None:
                findings.append(ErasureFinding(chain_id, epoch, seq,
                                               f"seq {seq}: value {label!r} erased but no erasure record names it"))
                continue
            c, rid = got
            if c != erased[label]:
                findings.append(ErasureFinding(chain_id, epoch, seq, f"seq {seq}: value {label!r} erased with a "
                                               f"commitment other than erasure {rid} records"))
                continue
            summ.values += 1
            summ.records[rid] = dates.get(rid, "")
    return findings, summaries


def _iso(ns: Any) -> str:
    import datetime

    try:
        t = datetime.datetime.fromtimestamp(int(ns) / 1e9, tz=datetime.timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return ""
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


__all__ = [
    "CheckedRecord",
    "ErasedSpan",
    "ErasureError",
    "ErasureFinding",
    "ErasureSummary",
    "build_record",
    "check_erased",
    "check_record",
    "erase_span",
    "note_text",
    "record_digest",
    "sign_record",
]
