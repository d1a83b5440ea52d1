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

import math
from collections.abc import Mapping
from typing import Any

import orjson

from otel_agenttape import native, semconv
from otel_agenttape.codec.typed import INT64_MAX, INT64_MIN
from otel_agenttape.integrity.leaf import (
    LEAF_VERSION,
    leaf_bytes,
    project_sdk,
    raw_attributes,
    sdk_trace_state,
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


def fast_leaf_sdk(span: Any) -> bytes | None:
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
            "v": LEAF_VERSION,
        }, option=_SORTED)
    except (orjson.JSONEncodeError, TypeError):
        return None  # e.g. an unpaired surrogate: the general path raises CanonicalError


# The compiled writer gives the bytes of ``python_leaf_from_sdk`` or steps aside with ``None``.
native_module = native.load("otel_agenttape.integrity._leaf")
_native_leaf_sdk = native_module.leaf_sdk if native_module is not None else None
_native_leaf_hash_sdk = native_module.leaf_hash_sdk if native_module is not None else None
NATIVE = native_module is not None


def leaf_from_sdk(span: Any) -> bytes:
    """Leaf of a live SDK span: the compiled writer when built, else ``python_leaf_from_sdk``."""
    if _native_leaf_sdk is not None:
        leaf = _native_leaf_sdk(span)
        if leaf is not None:
            return leaf
    return python_leaf_from_sdk(span)


def python_leaf_from_sdk(span: Any) -> bytes:
    """The reference for ``leaf_from_sdk``: the fast path below, else ``leaf_bytes(project_sdk(span))``."""
    try:
        leaf = fast_leaf_sdk(span)
    except (_General, AttributeError, OverflowError):  # AttributeError: not the SDK's ReadableSpan layout
        leaf = None
    return leaf if leaf is not None else leaf_bytes(project_sdk(span))


def leaf_hash_from_sdk(span: Any) -> bytes:
    """``merkle.leaf_hash(leaf_from_sdk(span))``: what sealing needs (compiled: one pass, no bytes object)."""
    if _native_leaf_hash_sdk is not None:
        lh = _native_leaf_hash_sdk(span)
        if lh is not None:
            return lh
    return leaf_hash(python_leaf_from_sdk(span))
