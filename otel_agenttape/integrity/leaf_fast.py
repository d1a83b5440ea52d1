"""The fast paths to the canonical leaf of a live SDK span, beside the reference in ``leaf.py``.

``leaf.leaf_bytes(leaf.project_sdk(span))`` defines the leaf of a live span. Sealing needs it (or its
Merkle leaf hash) for every span, so it is taken through, in order:
- the compiled writer (``_leaf.pyx``), when built and not turned off (``AGENTTAPE_NO_NATIVE``): the
  bytes written directly, or ``None`` for a span it leaves to the Python paths
  (``tests/test_leaf_native.py`` holds it equal to ``python_leaf_from_sdk``);
- ``fast_leaf_sdk``: the same objects built unsorted and sorted by orjson (below), or ``None``;
- the reference projection.

The interface is ``leaf_from_sdk``, ``leaf_hash_from_sdk`` and ``python_leaf_from_sdk``; the state is
the caches of keys and typed ints below (only caches: clearing them changes no leaf).
``native_module`` is the compiled module (or None), which the compiled sealing step is configured from.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from otel_agenttape import native, semconv
from otel_agenttape.codec.typed import INT64_MAX, INT64_MIN
from otel_agenttape.integrity.leaf import (
    LEAF_V1,
    LEAF_VERSION,
    SALT_BYTES,
    leaf_bytes,
    project_sdk,
    raw_attributes,
    sdk_trace_state,
    split_label,
)
from otel_agenttape.integrity.merkle import leaf_hash

_CHAIN_PREFIX = semconv.CHAIN_PREFIX

# --- the orjson path ------------------------------------------------------------------------------
# The general projection sorts every attribute set in Python. The fast path builds the same objects
# unsorted and lets orjson sort them (OPT_SORT_KEYS compares UTF-8 bytes, i.e. code points). Code-point
# order is RFC 8785's UTF-16 order unless a key holds a character above U+FFFF, so the fast path only
# takes attribute sets whose keys have none, whose values are scalars or arrays of scalars (no nested
# map to sort), and which hold no ``agenttape.chain.*`` key; anything else returns ``None`` and the
# general path decides (and raises what it raises). Keys that passed these checks are remembered, so
# a span whose keys were all seen before is checked with one set operation.
# ``tests/test_integrity_fastpath.py`` checks both paths give the same bytes.

_SORTED = orjson.OPT_SORT_KEYS
_dumps = orjson.dumps
_SPAN_KEYS: set[str] = set()  # keys fit for the fast path in a span's attributes
_OTHER_KEYS: set[str] = set()  # likewise in event and link attributes (chain keys allowed there)
_MAX_KEYS = 1 << 16  # bound on each set: start over past it (keys are only a cache)
# Typed forms of ints seen before (steps, token counts, ports): shared, never mutated (orjson only
# reads them). Keyed by the int alone: ``type(v) is int`` excludes bools, and floats never get here.
_INTS: dict[int, dict[str, str]] = {}
_MAX_INTS = 1 << 12


class _General(Exception):
    """A value the fast path leaves to the general projection."""


def _learn_keys(attrs: Mapping[str, Any], known: set[str], skip_chain: bool) -> None:
    for k in attrs:
        if type(k) is not str or (not k.isascii() and max(k) > "\uffff"):
            raise _General
        if skip_chain and k.startswith(_CHAIN_PREFIX):
            raise _General
    if len(known) > _MAX_KEYS:
        known.clear()
    known.update(attrs)


def _fast_other(v: Any) -> dict[str, Any]:
    t = type(v)
    if t is int:
        if INT64_MIN <= v <= INT64_MAX:
            return {"i": str(v)}
        raise _General
    if t is float:
        if v - v == 0.0:  # finite
            return {"d": repr(v)}
        return {"d": "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")}
    if t is bool:
        return {"bool": v}
    if t is tuple or t is list:
        return {"a": [{"s": x} if type(x) is str else _fast_item(x) for x in v]}
    if v is None:
        return {}
    raise _General


def _fast_item(v: Any) -> dict[str, Any]:
    """An array element: a scalar (a nested array or map goes to the general path)."""
    t = type(v)
    if t is tuple or t is list:
        raise _General
    return _fast_other(v)


def _fast_attrs(attrs: Mapping[str, Any], skip_chain: bool) -> dict[str, Any]:
    """Typed attributes in insertion order (orjson sorts them); raises ``_General`` when it cannot."""
    if not attrs:
        return {}
    known = _SPAN_KEYS if skip_chain else _OTHER_KEYS
    if not known.issuperset(attrs):
        _learn_keys(attrs, known, skip_chain)
    out = {}
    ints = _INTS
    for k, v in attrs.items():  # strings inline, ints from a cache: most values are one of those
        t = type(v)
        if t is str:
            out[k] = {"s": v}
        elif t is int:
            typed = ints.get(v)
            if typed is None:
                typed = _fast_other(v)
                if len(ints) >= _MAX_INTS:
                    ints.clear()
                ints[v] = typed
            out[k] = typed
        else:
            out[k] = _fast_other(v)
    return out


def _commit_fast(attrs: dict[str, Any], events: list[dict[str, Any]], salts: Mapping[str, bytes]) -> None:
    """Leaf v2 on the fast path's typed sets (flat values only, so orjson's sorted bytes are RFC 8785's)."""
    for label, salt in salts.items():
        idx, key = split_label(label)
        t = attrs if idx is None else events[idx]["attributes"]
        t[key] = {"c": _sha256(salt + _dumps(t[key], option=_SORTED)).hexdigest()}


_sha256 = hashlib.sha256


def fast_leaf_sdk(span: Any, salts: Mapping[str, bytes] | None = None) -> bytes | None:
    attrs = _fast_attrs(raw_attributes(span), True)
    evs = span._events
    evs = getattr(evs, "_dq", evs)  # an SDK BoundedList: its deque (the span has ended; no copy needed)
    events = []
    if evs:
        for e in evs:
            ea = e._attributes  # an Event's BoundedAttributes (or a plain mapping, or None)
            ea = getattr(ea, "_dict", ea)
            events.append({"attributes": _fast_attrs(ea, False) if ea else {},
                           "dropped_attributes_count": e.dropped_attributes,
                           "name": e._name, "time_unix_nano": str(e._timestamp)})
    lks = span._links
    lks = getattr(lks, "_dq", lks)
    links = [
        {"attributes": _fast_attrs(raw_attributes(lk), False), "dropped_attributes_count": lk.dropped_attributes,
         "span_id": f"{lk.context.span_id:016x}", "trace_id": f"{lk.context.trace_id:032x}"}
        for lk in lks
    ] if lks else []
    ctx = span._context
    parent = span._parent
    status = span._status
    ts = ctx.trace_state
    if salts:
        _commit_fast(attrs, events, salts)
    try:
        return _dumps({
            "attributes": attrs,
            "dropped_attributes_count": span.dropped_attributes,
            "dropped_events_count": span.dropped_events,
            "dropped_links_count": span.dropped_links,
            "end_time_unix_nano": str(span._end_time),
            "events": events,
            "kind": span._kind._value_ + 1,
            "links": links,
            "name": span._name,
            # ids as 8 / 16 big-endian bytes in hex (an id out of range: OverflowError, general path)
            "parent_span_id": parent.span_id.to_bytes(8, "big").hex() if parent is not None else "",
            "span_id": ctx.span_id.to_bytes(8, "big").hex(),
            "start_time_unix_nano": str(span._start_time),
            "status": {"code": status.status_code._value_, "message": status.description or ""},
            "trace_id": ctx.trace_id.to_bytes(16, "big").hex(),
            "trace_state": sdk_trace_state(ts) if ts else "",
            "v": LEAF_VERSION if salts is not None else LEAF_V1,
        }, option=_SORTED)
    except (orjson.JSONEncodeError, TypeError):
        return None  # e.g. an unpaired surrogate: the general path raises CanonicalError


# The compiled writer gives the bytes of ``python_leaf_from_sdk`` or steps aside with ``None``.
native_module = native.load("otel_agenttape.integrity._leaf")
_native_leaf_sdk = native_module.leaf_sdk if native_module is not None else None
_native_leaf_hash_sdk = native_module.leaf_hash_sdk if native_module is not None else None
_native_seal_hash_sdk = getattr(native_module, "seal_hash_sdk", None) if native_module is not None else None
NATIVE = native_module is not None


def leaf_from_sdk(span: Any) -> bytes:
    """Leaf of a live SDK span: the compiled writer when built, else ``python_leaf_from_sdk``."""
    if _native_leaf_sdk is not None:
        leaf = _native_leaf_sdk(span)
        if leaf is not None:
            return leaf
    return python_leaf_from_sdk(span)


def python_leaf_from_sdk(span: Any, salts: Mapping[str, bytes] | None = None) -> bytes:
    """The reference for ``leaf_from_sdk``: the fast path below, else ``leaf_bytes(project_sdk(span))``.

    ``salts``: commit these values (leaf v2, as sealing does); by default the span's own salts (a span
    that carries ``agenttape.chain.*`` keys always takes the general path)."""
    try:
        leaf = fast_leaf_sdk(span, salts)
    except (_General, AttributeError, OverflowError):  # AttributeError: not the SDK's ReadableSpan layout
        leaf = None
    return leaf if leaf is not None else leaf_bytes(project_sdk(span, salts))


# --- sealing: fresh salts for the content values -------------------------------------------------

CONTENT_KEYS = semconv.CONTENT_KEYS


def fresh_salts(span: Any, content_keys: frozenset[str] = CONTENT_KEYS,
                salt_source: Callable[[int], bytes] = os.urandom) -> dict[str, bytes] | None:
    """A fresh 128-bit salt per content value of a live span (span and event attributes), or None."""
    salts = None
    attrs = raw_attributes(span)
    if attrs and not content_keys.isdisjoint(attrs):
        salts = {k: salt_source(SALT_BYTES) for k in attrs if k in content_keys}
    evs = span._events if hasattr(span, "_events") else span.events
    if evs:
        for i, e in enumerate(getattr(evs, "_dq", evs)):
            ea = raw_attributes(e)
            if ea and not content_keys.isdisjoint(ea):
                if salts is None:
                    salts = {}
                for k in ea:
                    if k in content_keys:
                        salts[f"event:{i}:{k}"] = salt_source(SALT_BYTES)
    return salts


def salts_text(salts: Mapping[str, bytes]) -> str:
    """The ``agenttape.chain.salts`` attribute value: a JSON object of label -> hex salt."""
    return orjson.dumps({k: v.hex() for k, v in salts.items()}).decode()


def python_seal_hash_sdk(span: Any, content_keys: frozenset[str] = CONTENT_KEYS,
                         salt_source: Callable[[int], bytes] = os.urandom) -> tuple[bytes, str | None]:
    """``(Merkle leaf hash, salts attribute or None)`` of a live span sealed as leaf v2."""
    salts = fresh_salts(span, content_keys, salt_source)
    lh = leaf_hash(python_leaf_from_sdk(span, salts))
    return lh, (salts_text(salts) if salts is not None else None)


def seal_hash_sdk(span: Any) -> tuple[bytes, str | None]:
    """``python_seal_hash_sdk`` with the default content keys and salts, compiled when built."""
    if _native_seal_hash_sdk is not None:
        r = _native_seal_hash_sdk(span)
        if r is not None:
            return r
    return python_seal_hash_sdk(span)


def leaf_hash_from_sdk(span: Any) -> bytes:
    """``merkle.leaf_hash(leaf_from_sdk(span))``: what sealing needs (compiled: one pass, no bytes object)."""
    if _native_leaf_hash_sdk is not None:
        lh = _native_leaf_hash_sdk(span)
        if lh is not None:
            return lh
    return leaf_hash(python_leaf_from_sdk(span))
