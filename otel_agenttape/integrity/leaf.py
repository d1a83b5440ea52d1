"""The canonical leaf: RFC 8785 bytes of a typed projection of one span.

The same projection is built from three sources and must give the same bytes from each:
a live SDK ``ReadableSpan`` (``project_sdk``), an OTLP proto ``Span`` (``leaf_from_proto``) and a
stored ``spans`` row with its ``span_events`` / ``span_links`` rows (``leaf_from_row``). This module
is the reference; ``leaf_fast.leaf_from_sdk`` gives the leaf of a live span through the faster paths
(compiled, then orjson), which tests hold equal to ``leaf_bytes(project_sdk(span))``. The
projection is specified in ``docs/integrity.md``; values use the typed form of
``otel_agenttape.codec.typed``, maps in RFC 8785 key order. ``agenttape.chain.*`` attributes are the
chain's output and are left out, as are resource and scope attributes (collectors legitimately add
those) and span flags (set by the exporter from the transport context).

Leaf v2 (``docs/integrity.md``, "Leaf v2"): a span that carries ``agenttape.chain.salts`` (and, once
erased, ``agenttape.chain.erased``) has each named value replaced in its leaf by the commitment
``{"c": hex(sha256(salt || RFC 8785 bytes of the typed value))}``, and ``"v": 2``; an erased value is
absent and enters as the commitment the erased map keeps. A span without either map is a v1 leaf.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import hashlib
import re

import orjson

from otel_agenttape import semconv
from otel_agenttape.codec.typed import NotOtlpSafe, from_proto, strict_from_python
from otel_agenttape.integrity.jcs import CanonicalError, dumps_ordered, sorted_keys

LEAF_VERSION = 2  # the version of a leaf that commits to content (a leaf that commits none is v1)
LEAF_V1 = 1
SALT_BYTES = 16
_CHAIN_PREFIX = semconv.CHAIN_PREFIX
_SALTS, _ERASED = semconv.CHAIN_SALTS, semconv.CHAIN_ERASED
_SALT_HEX = re.compile(r"[0-9a-f]{32}")
_DIGEST_HEX = re.compile(r"[0-9a-f]{64}")
_sha256 = hashlib.sha256


class CommitmentError(ValueError):
    """Salts or erased commitments that do not fit the span: malformed, or naming a value that is not
    there (a salt for a missing value, a salt kept for an erased value, an erased value still present)."""


# --- leaf v2: salted commitments --------------------------------------------------------------------


def commitment_hex(salt: bytes, typed: Any) -> str:
    """``sha256(salt || RFC 8785 bytes of typed)`` in hex: what the leaf holds for a committed value
    (``typed`` in canonical key order, as the projections build it)."""
    return _sha256(salt + dumps_ordered(typed)).hexdigest()


def parse_salts(text: Any) -> dict[str, bytes]:
    """The ``agenttape.chain.salts`` map: label -> 16 salt bytes (32 lowercase hex digits)."""
    m = _json_map(text, semconv.CHAIN_SALTS)
    out = {}
    for label, h in m.items():
        if type(h) is not str or not _SALT_HEX.fullmatch(h):
            raise CommitmentError(f"malformed salt for {label!r}")
        out[label] = bytes.fromhex(h)
    return out


def parse_erased(text: Any) -> dict[str, str]:
    """The ``agenttape.chain.erased`` map: label -> commitment (64 lowercase hex digits)."""
    m = _json_map(text, semconv.CHAIN_ERASED)
    for label, h in m.items():
        if type(h) is not str or not _DIGEST_HEX.fullmatch(h):
            raise CommitmentError(f"malformed erased commitment for {label!r}")
    return m


def _json_map(text: Any, name: str) -> dict[str, Any]:
    if type(text) is not str:
        raise CommitmentError(f"{name} is not a string")
    try:
        m = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise CommitmentError(f"{name} is not JSON") from None
    if type(m) is not dict:
        raise CommitmentError(f"{name} is not a JSON object")
    return m


def split_label(label: str) -> tuple[int | None, str]:
    """``(event index or None, attribute key)`` of a salts / erased label."""
    if label.startswith("event:"):
        idx, sep, key = label[6:].partition(":")
        if sep and idx.isdigit() and str(int(idx)) == idx:
            return int(idx), key
    return None, label


def span_label(key: str) -> str:
    return key


def event_label(index: int, key: str) -> str:
    return f"event:{index}:{key}"


def apply_commitments(attributes: dict[str, Any], events: list[dict[str, Any]],
                      salts: Mapping[str, bytes] | None, erased: Mapping[str, str] | None) -> dict[str, Any]:
    """Replace committed values by their commitments and enter erased ones (in place for events).

    ``attributes`` and each event's ``attributes`` are typed sets in canonical key order; returns the
    span's attribute set (re-sorted when an erased key was entered). Raises ``CommitmentError``."""
    salts = salts or {}
    erased = erased or {}
    sets: dict[int | None, dict[str, Any]] = {}

    def target(idx: int | None, label: str) -> dict[str, Any]:
        if idx is None:
            return attributes
        if idx >= len(events):
            raise CommitmentError(f"{label!r} names event {idx}, the span has {len(events)}")
        return events[idx]["attributes"]

    for label, salt in salts.items():
        if label in erased:
            raise CommitmentError(f"salt kept for the erased value {label!r}")
        idx, key = split_label(label)
        t = target(idx, label)
        if key not in t:
            raise CommitmentError(f"salt for a missing value {label!r}")
        t[key] = {"c": commitment_hex(salt, t[key])}
    for label, c in erased.items():
        idx, key = split_label(label)
        t = target(idx, label)
        if key in t:
            raise CommitmentError(f"erased value still present {label!r}")
        t[key] = {"c": c}
        sets[idx] = t
    for idx, t in sets.items():
        ordered = {k: t[k] for k in sorted_keys(t)}
        if idx is None:
            attributes = ordered
        else:
            events[idx]["attributes"] = ordered
    return attributes


def parse_commitments(salts_text: Any, erased_text: Any) -> tuple[dict[str, bytes] | None, dict[str, str] | None]:
    return (None if salts_text is None else parse_salts(salts_text),
            None if erased_text is None else parse_erased(erased_text))


# --- typed values ---------------------------------------------------------------------------------


def typed_from_python(value: Any) -> dict[str, Any]:
    """Typed form of an SDK attribute value in canonical key order; raises ``NotOtlpSafe``."""
    return strict_from_python(value, sorted_keys)


def _attrs_python(attrs: Mapping[str, Any] | None, skip_chain: bool) -> dict[str, Any]:
    if not attrs:
        return {}
    keys = [k for k in attrs if not k.startswith(_CHAIN_PREFIX)] if skip_chain else list(attrs)
    out = {}
    for k in sorted_keys(keys):
        v = attrs[k]
        out[k] = {"s": v} if type(v) is str else strict_from_python(v, sorted_keys)  # strings: no call
    return out


def typed_from_proto(value: Any) -> dict[str, Any]:
    """Typed form of an OTLP ``AnyValue`` in canonical key order: the shared encoding, its maps
    re-ordered by ``canonical_typed``."""
    return canonical_typed(from_proto(value))


def leaf_attrs_from_proto(key_values: Iterable[Any], skip_chain: bool) -> dict[str, Any]:
    last: dict[str, Any] = {}
    for kv in key_values:  # duplicate keys: the last one wins (as in codec.typed)
        if skip_chain and kv.key.startswith(_CHAIN_PREFIX):
            continue
        last[kv.key] = kv.value
    return {k: typed_from_proto(last[k]) for k in sorted_keys(last)}


def canonical_typed(typed: Any) -> Any:
    """Re-order the maps of a stored typed value (arrays and kvlists) into canonical key order."""
    if "kv" in typed:
        kv = typed["kv"]
        return {"kv": {k: canonical_typed(kv[k]) for k in sorted_keys(kv)}}
    if "a" in typed:
        return {"a": [canonical_typed(v) for v in typed["a"]]}
    return typed


def leaf_attrs_stored(attrs: Any, skip_chain: bool) -> dict[str, Any]:
    if attrs is None:
        return {}
    if isinstance(attrs, (str, bytes)):
        attrs = orjson.loads(attrs) if attrs else {}
    keys = [k for k in attrs if not k.startswith(_CHAIN_PREFIX)] if skip_chain else list(attrs)
    out = {}
    for k in sorted_keys(keys):
        v = attrs[k]
        out[k] = canonical_typed(v) if ("kv" in v or "a" in v) else v
    return out


# --- projections ----------------------------------------------------------------------------------


def _projection(
    trace_id: str, span_id: str, parent: str, trace_state: str, name: str, kind: int,
    start: int, end: int, status_code: int, status_message: str, attributes: dict[str, Any],
    dropped_attrs: int, dropped_events: int, dropped_links: int,
    events: list[dict[str, Any]], links: list[dict[str, Any]],
    salts: Mapping[str, bytes] | None = None, erased: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    version = LEAF_V1
    if salts is not None or erased is not None:
        attributes = apply_commitments(attributes, events, salts, erased)
        version = LEAF_VERSION
    # keys inserted in RFC 8785 order (all ASCII)
    return {
        "attributes": attributes,
        "dropped_attributes_count": dropped_attrs,
        "dropped_events_count": dropped_events,
        "dropped_links_count": dropped_links,
        "end_time_unix_nano": str(end),
        "events": events,
        "kind": kind,
        "links": links,
        "name": name,
        "parent_span_id": parent,
        "span_id": span_id,
        "start_time_unix_nano": str(start),
        "status": {"code": status_code, "message": status_message},
        "trace_id": trace_id,
        "trace_state": trace_state,
        "v": version,
    }


def _event(name: str, time: int, attributes: dict[str, Any], dropped: int) -> dict[str, Any]:
    return {
        "attributes": attributes,
        "dropped_attributes_count": dropped,
        "name": name,
        "time_unix_nano": str(time),
    }


def _link(trace_id: str, span_id: str, attributes: dict[str, Any], dropped: int) -> dict[str, Any]:
    # A link's trace_state is left out: the Python OTLP exporter (1.45) does not send it.
    return {
        "attributes": attributes,
        "dropped_attributes_count": dropped,
        "span_id": span_id,
        "trace_id": trace_id,
    }


def sdk_trace_state(ts: Any) -> str:
    if not ts:
        return ""
    return ",".join(f"{k}={v}" for k, v in ts.items())


def raw_attributes(obj: Any) -> Mapping[str, Any]:
    """The plain dict behind an SDK attribute holder (``BoundedAttributes`` reads are slow)."""
    attrs = getattr(obj, "_attributes", None)
    if attrs is None:
        attrs = obj.attributes
    inner = getattr(attrs, "_dict", None)
    return inner if inner is not None else (attrs or {})


def project_sdk(span: Any, salts: Mapping[str, bytes] | None = None) -> dict[str, Any]:
    """Projection of a live SDK ``ReadableSpan``; raises ``NotOtlpSafe`` for values OTLP cannot carry.

    ``salts``: commit these values (sealing); by default the span's own ``agenttape.chain.salts``."""
    raw = raw_attributes(span)
    erased = None
    if salts is None:
        salts, erased = parse_commitments(raw.get(_SALTS), raw.get(_ERASED))
    ctx = span.context
    parent = span.parent
    status = span.status
    events = [
        _event(e.name, e.timestamp, _attrs_python(raw_attributes(e), False), e.dropped_attributes)
        for e in span._events
    ] if span._events else []
    links = [
        _link(
            f"{lk.context.trace_id:032x}", f"{lk.context.span_id:016x}",
            _attrs_python(raw_attributes(lk), False), lk.dropped_attributes,
        )
        for lk in span._links
    ] if span._links else []
    return _projection(
        f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", f"{parent.span_id:016x}" if parent is not None else "",
        sdk_trace_state(ctx.trace_state), span.name, span.kind.value + 1,
        span.start_time, span.end_time, status.status_code.value, status.description or "",
        _attrs_python(raw, True),
        span.dropped_attributes, span.dropped_events, span.dropped_links, events, links, salts, erased,
    )


def project_proto(span: Any) -> dict[str, Any]:
    """Projection of an OTLP ``opentelemetry.proto.trace.v1.Span`` message."""
    salts_text = erased_text = None
    for kv in span.attributes:
        if kv.key == _SALTS or kv.key == _ERASED:
            text = kv.value.string_value if kv.value.WhichOneof("value") == "string_value" else kv.value
            if kv.key == _SALTS:
                salts_text = text
            else:
                erased_text = text
    salts, erased = parse_commitments(salts_text, erased_text)
    events = [
        _event(e.name, e.time_unix_nano, leaf_attrs_from_proto(e.attributes, False), e.dropped_attributes_count)
        for e in span.events
    ]
    links = [
        _link(lk.trace_id.hex(), lk.span_id.hex(), leaf_attrs_from_proto(lk.attributes, False), lk.dropped_attributes_count)
        for lk in span.links
    ]
    return _projection(
        span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(), span.trace_state, span.name,
        int(span.kind), span.start_time_unix_nano, span.end_time_unix_nano,
        int(span.status.code), span.status.message, leaf_attrs_from_proto(span.attributes, True),
        span.dropped_attributes_count, span.dropped_events_count, span.dropped_links_count, events, links,
        salts, erased,
    )


def project_row(
    row: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]] = (),
    links: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Projection of a stored ``spans`` row plus its ``span_events`` and ``span_links`` rows.

    Events and links are taken in ``event_index`` / ``link_index`` order.
    """
    attrs = row["attributes"]
    if isinstance(attrs, (str, bytes)):
        attrs = orjson.loads(attrs) if attrs else {}
    salts, erased = parse_commitments(*(_stored_text(attrs.get(k)) for k in (_SALTS, _ERASED))) if attrs else (None, None)
    ev = [
        _event(e["name"], int(e["time_unix_nano"]), leaf_attrs_stored(e["attributes"], False),
               int(e.get("dropped_attributes_count") or 0))
        for e in sorted(events, key=lambda r: r["event_index"])
    ]
    lk = [
        _link(r["linked_trace_id"], r["linked_span_id"], leaf_attrs_stored(r["attributes"], False),
              int(r.get("dropped_attributes_count") or 0))
        for r in sorted(links, key=lambda r: r["link_index"])
    ]
    return _projection(
        row["trace_id"], row["span_id"], row.get("parent_span_id") or "", row.get("trace_state") or "",
        row["name"], int(row["kind"]), int(row["start_time_unix_nano"]), int(row["end_time_unix_nano"]),
        int(row.get("status_code") or 0), row.get("status_message") or "",
        leaf_attrs_stored(attrs, True),
        int(row.get("dropped_attributes_count") or 0), int(row.get("dropped_events_count") or 0),
        int(row.get("dropped_links_count") or 0), ev, lk, salts, erased,
    )


def _stored_text(typed: Any) -> Any:
    if typed is None:
        return None
    if type(typed) is dict and "s" in typed:
        return typed["s"]
    return typed  # not a string: parse_* refuses it


def leaf_bytes(projection: Mapping[str, Any]) -> bytes:
    """RFC 8785 bytes of a projection built by one of the ``project_*`` functions."""
    return dumps_ordered(projection)


def leaf_from_proto(span: Any) -> bytes:
    return leaf_bytes(project_proto(span))


def leaf_from_row(row: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = (),
                  links: Sequence[Mapping[str, Any]] = ()) -> bytes:
    return leaf_bytes(project_row(row, events, links))


__all__ = [
    "LEAF_V1",
    "LEAF_VERSION",
    "SALT_BYTES",
    "CanonicalError",
    "CommitmentError",
    "apply_commitments",
    "commitment_hex",
    "parse_erased",
    "parse_salts",
    "NotOtlpSafe",
    "canonical_typed",
    "leaf_bytes",
    "leaf_from_proto",
    "leaf_from_row",
    "project_proto",
    "project_row",
    "project_sdk",
    "typed_from_proto",
    "typed_from_python",
]
