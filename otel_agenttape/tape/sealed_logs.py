"""The log records sealed into spans, checked against the stored ``log_records`` rows.

A sealed span that had log records emitted in it carries an ``agenttape.logs`` event naming each
record's leaf hash (``integrity.log_leaf``); the event is part of the span's leaf, so the chain check
covers the names. Here each named span's stored log rows are hashed again and compared with the
names: a sealed row (``agenttape.chain.log_sealed``) whose leaf is not named (edited, or added
under the span) is tampering at the span's seq, a named leaf with no row a missing log record. Log records of spans without the event (no
span, emitted after the span ended, or from a process that did not seal logs) are not covered. A
sealed record missing from the store is reported like a missing span (kind ``gap``: lost in export,
which capture counts, or deleted). Values erased from a sealed record keep its leaf (the commitment
stays) and must be named by an erasure record, like a span's (``integrity.erasure.check_erased``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from otel_agenttape.integrity.leaf import CommitmentError, parse_erased
from otel_agenttape.integrity.log_leaf import (
    EVENT_LOGS,
    LOG_SEALED,
    LOGS_COUNT,
    LOGS_LEAVES,
    erased_label,
    leaf_from_row,
    stored_attributes,
)
from otel_agenttape.integrity.verify import GAP, TAMPER, Issue
from otel_agenttape.semconv import CHAIN_ERASED
from otel_agenttape.tape.sealed_rows import typed_scalar

_LOG_COLUMNS = ("trace_id", "span_id", "time_unix_nano", "observed_time_unix_nano", "severity_number",
                "severity_text", "event_name", "body", "attributes", "flags", "dropped_attributes_count")


def _claims_sql(where: str) -> str:
    return (
        "SELECT s.chain_id, s.chain_epoch, s.chain_seq, e.trace_id, e.span_id, e.attributes "
        "FROM span_events e JOIN (SELECT trace_id, span_id, chain_id, chain_epoch, chain_seq FROM spans "
        f"WHERE {where}) s ON e.trace_id = s.trace_id AND e.span_id = s.span_id WHERE e.name = ?")


def _names(attrs_text: Any) -> tuple[int | None, list[str] | None]:
    try:
        a = orjson.loads(attrs_text) if attrs_text else {}
        count = typed_scalar(a.get(LOGS_COUNT))
        leaves = a.get(LOGS_LEAVES)
        names = [typed_scalar(v) for v in leaves["a"]] if isinstance(leaves, dict) and "a" in leaves else None
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return None, None
    if names is None or not all(isinstance(n, str) for n in names):
        return count if isinstance(count, int) else None, None
    return count if isinstance(count, int) else None, names


@dataclass
class LogFindings:
    """Per ``(chain_id, epoch, trace_id)``: the findings; and the values erased from sealed log records,
    as ``(chain_id, epoch, seq, trace_id, span_id, {label: commitment})`` for the erasure check (the
    labels ``log_leaf.erased_label``)."""

    issues: dict[tuple[str, int, str], list[Issue]] = field(default_factory=lambda: defaultdict(list))
    erased: list[tuple[str, int, int, str, str, dict[str, str]]] = field(default_factory=list)


def log_issues(reader: Any, where: str, params: Sequence[Any]) -> LogFindings:
    """The findings for the sealed spans ``where`` selects that name log records."""
    claims = reader.query(_claims_sql(where), [*params, EVENT_LOGS]).to_pylist()
    found = LogFindings()
    out = found.issues
    if not claims:
        return found
    cols = ", ".join(f"l.{c}" for c in _LOG_COLUMNS)
    rows = reader.query(
        f"SELECT {cols} FROM log_records l JOIN (SELECT DISTINCT e.trace_id, e.span_id FROM span_events e "
        f"JOIN (SELECT trace_id, span_id FROM spans WHERE {where}) s ON e.trace_id = s.trace_id "
        "AND e.span_id = s.span_id WHERE e.name = ?) c ON l.trace_id = c.trace_id AND l.span_id = c.span_id",
        [*params, EVENT_LOGS]).to_pylist()
    stored: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        stored[(row["trace_id"], row["span_id"])].append(row)
    for c in claims:
        seq = int(c["chain_seq"])
        key = (c["chain_id"], int(c["chain_epoch"] or 0), c["trace_id"])
        count, names = _names(c["attributes"])
        if names is None or count != len(names):
            out[key].append(Issue(seq, TAMPER, f"log records of seq {seq}: malformed {EVENT_LOGS} event"))
            continue
        leaves: Counter[str] = Counter()
        bad = 0
        erased: dict[str, str] = {}
        for row in stored.get((c["trace_id"], c["span_id"]), ()):
            try:
                raw = stored_attributes(row)
                if LOG_SEALED not in raw:
                    continue  # not sealed (written after the span ended): not covered
                leaf = leaf_from_row(row, raw)
                leaves[leaf] += 1
                if CHAIN_ERASED in raw:
                    gone = parse_erased(raw[CHAIN_ERASED].get("s"))
                    erased.update({erased_label(leaf, k): v for k, v in gone.items()})
            except (CommitmentError, ValueError, TypeError, AttributeError):
                bad += 1
        if erased:
            found.erased.append((key[0], key[1], seq, c["trace_id"], c["span_id"], erased))
        expected = Counter(names)
        extra = sum((leaves - expected).values()) + bad
        missing = sum((expected - leaves).values())
        if extra:
            out[key].append(Issue(seq, TAMPER, f"log records of seq {seq} edited or added: {extra} stored "
                                               f"record(s) not sealed with it ({len(names)} sealed)"))
        elif missing:
            out[key].append(Issue(seq, GAP, f"log records of seq {seq} missing: {missing} of {len(names)} "
                                            "sealed record(s) not in the store (lost in export, or deleted)"))
    return found
