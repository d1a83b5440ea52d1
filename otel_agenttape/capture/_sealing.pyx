# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled common step of ``SealingSpanProcessor._seal``: a span of an open tape, no checkpoint due.

``step(state, span)`` does what ``_seal`` does for the span that ends inside a run whose tape already
has its chain (almost every span): the leaf hash (``integrity/_leaf.pyx``), the chain link under the
state's lock, and the forwarded copy with the ``agenttape.chain.*`` attributes. It reads and changes
only the ``sealing_fast.SealState`` it is given (its lock, tapes, cadence settings and ``sealed``
count) and the tapes' public fields; whether a checkpoint is due is the comparison with the tape's
``due_size`` / ``due_time``, which ``SealState.schedule`` (the cadence rule) sets. Whatever else the
span needs (the tape or its chain to open, a checkpoint due, the tape's root ending, a value to make
OTLP-safe, a span layout it does not know) is decided before anything changes, and the span is handed
back, with its leaf hash if it has one, for the Python step, which stays the one place where those
cases are handled. ``tests/test_sealing_native.py`` seals the same spans both ways.

Reads of the OTel SDK's own span internals: ``span._attributes`` (a dict, or a ``BoundedAttributes``
whose ``_dict`` is the plain dict), ``span._context`` (taken only when its type is the ``SpanContext``
whose tuple layout ``_leaf.verified_span_context()`` checked on a probe at import; anything else goes
to the Python step) and ``span.__dict__`` (copied as ``SealedSpan.__init__`` copies it).
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
cdef str _CHAIN_SALTS = semconv.CHAIN_SALTS
cdef object _leaf_hash = None  # integrity._leaf.seal_hash_sdk: (hash, salts or None), or None for the Python path
cdef object _SealedSpan = None
cdef object _SpanContext = None
cdef str _ORIGINAL = None  # the SealedSpan fields set over the copied __dict__ (sealed_span.py)
cdef str _ATTRIBUTES = None
cdef object _new = object.__new__
cdef tuple _NO_HASH = (None, None)


def configure(seal_hash: object, sealed_type: type, span_context_type: type, original_field: str,
              attributes_field: str) -> None:
    """Set the compiled leaf hash, ``SealedSpan`` and its two fields, and the SDK's ``SpanContext``
    (``sealing_fast.configure`` does)."""
    global _leaf_hash, _SealedSpan, _SpanContext, _ORIGINAL, _ATTRIBUTES
    _leaf_hash = seal_hash
    _SealedSpan = sealed_type
    _SpanContext = span_context_type
    _ORIGINAL = original_field
    _ATTRIBUTES = attributes_field


def step(state: object, span: object):
    """``(sealed copy, None)``, or ``(None, (leaf hash, salts) or None)`` for the Python step."""
    cdef PyObject* raw
    if not state.seal_foreign or _leaf_hash is None:
        return _NO_HASH
    seal_hash = state.seal_hash  # the processor's own (v1 leaves), else the configured v2 one
    sh = (_leaf_hash if seal_hash is None else seal_hash)(span)
    if sh is None:
        return _NO_HASH
    lh = <object>PyTuple_GET_ITEM(sh, 0)
    salts = <object>PyTuple_GET_ITEM(sh, 1)
    attrs = span._attributes
    if type(attrs) is not dict:
        attrs = getattr(attrs, "_dict", None)
    ctx = span._context
    if type(attrs) is not dict or type(ctx) is not _SpanContext or state.on_nodes:
        return None, sh
    trace_id = <object>PyTuple_GET_ITEM(ctx, 0)
    span_id = <object>PyTuple_GET_ITEM(ctx, 1)
    now = _monotonic()
    link = None
    with state.lock:  # (the Python step takes the lock itself: it is called after this block)
        raw = PyDict_GetItem(state.tapes, trace_id)
        if raw != NULL:
            tape = <object>raw
            chain = tape.chain
            if not (
                chain is None
                or tape.resource is None
                or span_id == tape.root_span_id  # the tape's root: its checkpoint closes the tape
                or chain.size + 1 >= tape.due_size  # the size after this span's link
                or now >= tape.due_time
            ):
                link = chain.append_hash(lh)
                state.sealed += 1
    if link is None:
        return None, sh
    out = PyDict_Copy(attrs)
    PyDict_SetItem(out, _CHAIN_ID, <object>PyTuple_GET_ITEM(link, 0))
    PyDict_SetItem(out, _CHAIN_SEQ, <object>PyTuple_GET_ITEM(link, 2))
    PyDict_SetItem(out, _CHAIN_PREV, <object>PyTuple_GET_ITEM(link, 3))
    PyDict_SetItem(out, _CHAIN_HASH, <object>PyTuple_GET_ITEM(link, 4))
    PyDict_SetItem(out, _CHAIN_EPOCH, <object>PyTuple_GET_ITEM(link, 1))
    if salts is not None:
        PyDict_SetItem(out, _CHAIN_SALTS, salts)
    d = PyDict_Copy(span.__dict__)  # SealedSpan.__init__ without its frame
    PyDict_SetItem(d, _ORIGINAL, span)
    PyDict_SetItem(d, _ATTRIBUTES, out)
    sealed = _new(_SealedSpan)
    sealed.__dict__ = d
    return sealed, None
