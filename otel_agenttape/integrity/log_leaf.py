"""The leaf of a log record sealed into the span it was emitted in.

A log record (a GenAI event, bridged Python logging) emitted while its span is live is sealed into
that span: the span carries an ``agenttape.logs`` event naming the sorted leaf hashes of its log
records (``LOGS_LEAVES``, with their count), and that event is part of the span's own leaf, so the
chain covers it. A log leaf is ``sha256`` of the RFC 8785 bytes of the projection below, built from
what OTLP carries (the SDK's encoding at capture, the stored row at verification). Its body and its
content attributes (``semconv.CONTENT_KEYS``) enter as salted commitments, the salts beside them in
the record's ``agenttape.chain.salts`` (label ``@body`` for the body), as leaf v2 does for spans; the
``agenttape.chain.*`` attributes are left out. A sealed record carries ``LOG_SEALED``: a record
without it (written after its span ended, say) is not covered, even under a span that names others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from otel_agenttape import semconv
from otel_agenttape.integrity.erasure import erase_span
from otel_agenttape.integrity.jcs import dumps_ordered, sorted_keys
from otel_agenttape.integrity.leaf import (
    CommitmentError,
    leaf_attrs_from_proto,
    leaf_attrs_stored,
    parse_commitments,
    apply_commitments,
    canonical_typed,
    commitment_hex,
    typed_from_proto,
)

LOG_LEAF_VERSION = "log1"
BODY_LABEL = "@body"
EVENT_LOGS = "agenttape.logs"  # the span event that names the span's sealed log records
LOGS_COUNT = "agenttape.logs.count"
LOGS_LEAVES = "agenttape.logs.leaves"  # sorted hex sha256 of each log record's leaf
# on a sealed log record: which records a span's names cover (a record without it is not sealed)
LOG_SEALED = "agenttape.chain.log_sealed"


def _apply(body: Any, attributes: dict[str, Any], salts: Mapping[str, bytes] | None,
           erased: Mapping[str, str] | None) -> tuple[Any, dict[str, Any]]:
    salts = dict(salts or {})
    erased = dict(erased or {})
    body_salt = salts.pop(BODY_LABEL, None)
    body_erased = erased.pop(BODY_LABEL, None)
    if body_salt is not None and body_erased is not None:
        raise CommitmentError(f"salt kept for the erased value {BODY_LABEL!r}")
    if body_salt is not None:
        if body is None:
            raise CommitmentError(f"salt for a missing value {BODY_LABEL!r}")
        body = {"c": commitment_hex(body_salt, body)}
    elif body_erased is not None:
        if body is not None:
            raise CommitmentError(f"erased value still present {BODY_LABEL!r}")
        body = {"c": body_erased}
    if salts or erased:
        attributes = apply_commitments(attributes, [], salts, erased)
    return body, attributes


def projection(*, trace_id: str, span_id: str, time_unix_nano: int, observed_time_unix_nano: int,
               severity_number: int, severity_text: str, event_name: str, body: Any,
               attributes: dict[str, Any], flags: int, dropped_attributes_count: int,
               salts: Mapping[str, bytes] | None = None, erased: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The canonical form of one log record (typed values in canonical key order); raises ``CommitmentError``."""
    body, attributes = _apply(body, attributes, salts, erased)
    return {  # keys in RFC 8785 order (all ASCII)
        "attributes": attributes,
        "body": body,
        "dropped_attributes_count": int(dropped_attributes_count or 0),
        "event_name": event_name or "",
        "flags": int(flags or 0),
        "observed_time_unix_nano": str(int(observed_time_unix_nano or 0)),
        "severity_number": int(severity_number or 0),
        "severity_text": severity_text or "",
        "span_id": span_id,
        "time_unix_nano": str(int(time_unix_nano or 0)),
        "trace_id": trace_id,
        "v": LOG_LEAF_VERSION,
    }


def leaf_hex(proj: Mapping[str, Any]) -> str:
    return hashlib.sha256(dumps_ordered(proj)).hexdigest()


def leaf_from_proto(rec: Any, salts: Mapping[str, bytes] | None) -> str:
    """The leaf hash of an OTLP ``LogRecord`` as the exporter sends it (``salts``: the ones just drawn)."""
    return leaf_hex(projection(
        trace_id=rec.trace_id.hex(), span_id=rec.span_id.hex(), time_unix_nano=rec.time_unix_nano,
        observed_time_unix_nano=rec.observed_time_unix_nano, severity_number=rec.severity_number,
        severity_text=rec.severity_text, event_name=rec.event_name,
        body=typed_from_proto(rec.body) if rec.HasField("body") else None,
        attributes=leaf_attrs_from_proto(rec.attributes, skip_chain=True), flags=rec.flags,
        dropped_attributes_count=rec.dropped_attributes_count, salts=salts))


def stored_attributes(row: Mapping[str, Any]) -> dict[str, Any]:
    text = row.get("attributes")
    return orjson.loads(text) if isinstance(text, (str, bytes)) and text else dict(text or {})


def leaf_from_row(row: Mapping[str, Any], raw: dict[str, Any] | None = None) -> str:
    """The leaf hash of a stored ``log_records`` row (``raw``: its attributes, parsed); raises
    ``CommitmentError`` for salts or erased values that do not fit it."""
    if raw is None:
        raw = stored_attributes(row)
    salts, erased = parse_commitments(_text(raw.get(semconv.CHAIN_SALTS)), _text(raw.get(semconv.CHAIN_ERASED)))
    body_text = row.get("body")
    body = orjson.loads(body_text) if isinstance(body_text, (str, bytes)) else body_text
    return leaf_hex(projection(
        trace_id=row.get("trace_id") or "", span_id=row.get("span_id") or "",
        time_unix_nano=row.get("time_unix_nano") or 0,
        observed_time_unix_nano=row.get("observed_time_unix_nano") or 0,
        severity_number=row.get("severity_number") or 0, severity_text=row.get("severity_text") or "",
        event_name=row.get("event_name") or "", body=None if body is None else canonical_typed(body),
        attributes=leaf_attrs_stored(raw, skip_chain=True), flags=row.get("flags") or 0,
        dropped_attributes_count=row.get("dropped_attributes_count") or 0, salts=salts, erased=erased))


def _text(typed: Any) -> Any:
    """A stored typed string's text (None when absent; anything else is refused by ``parse_commitments``)."""
    if typed is None:
        return None
    return typed.get("s", typed) if isinstance(typed, dict) else typed


def salts_text(salts: Mapping[str, bytes]) -> str:
    """The ``agenttape.chain.salts`` value for ``salts`` (label -> 16 bytes)."""
    return orjson.dumps({k: salts[k].hex() for k in sorted_keys(salts)}).decode()


def content_labels(has_body: bool, keys: Iterable[str], content_keys: frozenset[str]) -> list[str]:
    """The labels a record's salts cover: its body and its content attributes."""
    out = [BODY_LABEL] if has_body else []
    out.extend(k for k in keys if k in content_keys)
    return out


def erased_label(leaf: str, label: str) -> str:
    """How an erasure record names a value erased from a sealed log record: by the record's leaf hash
    (unchanged by erasure, which keeps the commitment) and the value's label."""
    return f"log:{leaf}:{label}"


def erase_log(body: Any, attributes: Mapping[str, Any]) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """Erase the salted values of a stored sealed log record: ``(body, attributes, {label: commitment})``
    after it (the body None when it was erased). Each value and its salt go, its commitment joins
    ``agenttape.chain.erased``, so the record's leaf, and the span that names it, still verify.
    Raises ``CommitmentError`` for salts that do not fit the record."""
    attrs = dict(attributes)
    if BODY_LABEL in attrs:
        raise CommitmentError(f"an attribute named {BODY_LABEL!r}")
    if body is not None:
        attrs[BODY_LABEL] = body
    done = erase_span(attrs, [])
    out = done.attributes
    return out.pop(BODY_LABEL, None), out, done.erased
