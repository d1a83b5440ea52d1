# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled common case of ``SealingSpanProcessor._seal``: a span of an open tape, no checkpoint due.

``seal(proc, span)`` does what ``_seal`` does for the span that ends inside a run whose tape already
has its chain (almost every span): the leaf hash (``integrity/_leaf.pyx``), the chain link under the
processor's lock, and the forwarded copy with the ``agenttape.chain.*`` attributes. Whatever else the
span needs (the tape or its chain to open, a checkpoint due, the tape's root ending, a value to make
OTLP-safe, a span layout it does not know) is decided before anything changes, and the span is then
handed to ``proc._seal`` with the leaf hash if it has one, so the Python method stays the one place
where those cases are handled. ``tests/test_sealing_native.py`` seals the same spans both ways.
"""

from cpython.dict cimport PyDict_Copy, PyDict_GetItem, PyDict_SetItem
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM

import time

from otel_agenttape import semconv

cdef object _monotonic = time.monotonic
cdef str _CHAIN_ID = semconv.CHAIN_ID
cdef str _CHAIN_SEQ = semconv.CHAIN_SEQ
cdef str _CHAIN_PREV = semconv.CHAIN_PREV
cdef str _CHAIN_HASH = semconv.CHAIN_HASH
cdef str _CHAIN_EPOCH = semconv.CHAIN_EPOCH
cdef object _leaf_hash = None  # integrity._leaf.leaf_hash_sdk: bytes, or None for the Python path
cdef object _SealedSpan = None
cdef object _SpanContext = None
cdef object _new = object.__new__


def configure(leaf_hash: object, sealed_type: type, span_context_type: type) -> None:
    """Set the compiled leaf hash, ``sealing.SealedSpan`` and the SDK's ``SpanContext`` (sealing.py does)."""
    global _leaf_hash, _SealedSpan, _SpanContext
    _leaf_hash = leaf_hash
    _SealedSpan = sealed_type
    _SpanContext = span_context_type


def seal(proc: object, span: object):
    """``proc._seal(span)``: the sealed copy and the checkpoint due (always ``None`` here)."""
    cdef PyObject* raw
    if not proc.seal_foreign or _leaf_hash is None:
        return proc._seal(span)
    lh = _leaf_hash(span)
    if lh is None:
        return proc._seal(span)
    attrs = span._attributes
    if type(attrs) is not dict:
        attrs = getattr(attrs, "_dict", None)
    ctx = span._context
    if type(attrs) is not dict or type(ctx) is not _SpanContext:
        return proc._seal(span, lh)
    trace_id = <object>PyTuple_GET_ITEM(ctx, 0)
    span_id = <object>PyTuple_GET_ITEM(ctx, 1)
    now = _monotonic()
    link = None
    with proc._lock:  # (proc._seal takes the lock itself: it is called after this block)
        raw = PyDict_GetItem(proc._tapes, trace_id)
        if raw != NULL:
            tape = <object>raw
            chain = tape.chain
            if not (
                chain is None
                or tape.resource is None
                or proc._timer is None
                or proc.checkpoint_on_nodes
                or span_id == tape.root_span_id  # the tape's root: its checkpoint closes the tape
                or chain.size + 1 - tape.cp_base >= proc.checkpoint_every
                or now - tape.last_cp_time >= proc.checkpoint_interval_s
            ):
                link = chain.append_hash(lh)
                proc.sealed += 1
    if link is None:
        return proc._seal(span, lh)
    out = PyDict_Copy(attrs)
    PyDict_SetItem(out, _CHAIN_ID, <object>PyTuple_GET_ITEM(link, 0))
    PyDict_SetItem(out, _CHAIN_SEQ, <object>PyTuple_GET_ITEM(link, 2))
    PyDict_SetItem(out, _CHAIN_PREV, <object>PyTuple_GET_ITEM(link, 3))
    PyDict_SetItem(out, _CHAIN_HASH, <object>PyTuple_GET_ITEM(link, 4))
    PyDict_SetItem(out, _CHAIN_EPOCH, <object>PyTuple_GET_ITEM(link, 1))
    d = PyDict_Copy(span.__dict__)  # SealedSpan.__init__ without its frame
    PyDict_SetItem(d, "_original", span)
    PyDict_SetItem(d, "_attributes", out)
    sealed = _new(_SealedSpan)
    sealed.__dict__ = d
    return sealed, None
