# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled canonical leaf of a live SDK span: the bytes of ``leaf_fast.python_leaf_from_sdk``, written directly.

``leaf_sdk(span)`` writes the RFC 8785 leaf (``docs/integrity.md``) of an SDK ``ReadableSpan`` into a
buffer, without the typed dicts and the orjson call of the Python fast path. It takes the same
domain as that path, or less: attribute keys that are exact ``str`` without characters above U+FFFF
(so that code-point order is RFC 8785's UTF-16 order), no ``agenttape.chain.*`` key among the span's
attributes, values that are exact ``str``/``int`` (int64)/``float``/``bool``/``None`` or flat
tuples/lists of those. Anything else (a bytes value, a map, an integer beyond int64, an unpaired
surrogate, an unknown span layout) returns ``None`` and the Python path decides, so the compiled
path can only ever give the Python path's bytes or step aside. Strings are written as orjson writes
them: UTF-8, with only ``"``, ``\\`` and control characters escaped (``\\b \\f \\n \\r \\t`` short,
others ``\\u00xx``). ``leaf_hash_sdk(span)`` hashes the same bytes in the buffer, behind the Merkle
leaf prefix. ``seal_hash_sdk(span)`` is what sealing needs: the leaf hash with every content value
(``semconv.CONTENT_KEYS``) written as its salted commitment (leaf v2), fresh 16-byte salts taken
from a pool of ``os.urandom`` bytes (each used once), and the ``agenttape.chain.salts`` text.
``tests/test_leaf_native.py`` compares both paths byte for byte.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.list cimport PyList_GET_ITEM, PyList_Sort
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_AsUnsignedLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.object cimport PyObject
from libc.math cimport isinf, isnan
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from otel_agenttape.codec._sdk_span cimport context_fields

import hashlib
import os
from collections import OrderedDict

from otel_agenttape import semconv

cdef extern from *:
    """
    #if PY_VERSION_HEX < 0x030C0000
    #define AT_UNICODE_READY(o) PyUnicode_READY(o)
    #else
    #define AT_UNICODE_READY(o) 0
    #endif
    """
    int AT_UNICODE_READY(object) except -1

cdef extern from *:
    """
    /* The length of the run of bytes from s that need no escaping in a JSON string (ASCII input):
       16 bytes at a time with SSE2 (part of every x86-64), else 8 at a time in a 64-bit word. */
    #if defined(__SSE2__)
    #include <emmintrin.h>
    static inline Py_ssize_t at_plain_run(const unsigned char* s, Py_ssize_t n) {
        Py_ssize_t i = 0;
        const __m128i quote = _mm_set1_epi8(0x22), bslash = _mm_set1_epi8(0x5C), space = _mm_set1_epi8(0x20);
        while (i + 16 <= n) {
            __m128i x = _mm_loadu_si128((const __m128i*)(s + i));
            /* bytes are ASCII (below 0x80): a signed compare with 0x20 finds the control characters */
            __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                                       _mm_cmplt_epi8(x, space));
            int mask = _mm_movemask_epi8(hit);
            if (mask) return i + __builtin_ctz((unsigned)mask);
            i += 16;
        }
        return i;
    }
    #else
    static inline Py_ssize_t at_plain_run(const unsigned char* s, Py_ssize_t n) {
        Py_ssize_t i = 0;
        while (i + 8 <= n) {
            uint64_t x, q, b;
            memcpy(&x, s + i, 8);
            q = x ^ 0x2222222222222222ULL;
            b = x ^ 0x5C5C5C5C5C5C5C5CULL;
            if ((((x - 0x2020202020202020ULL) & ~x) | ((q - 0x0101010101010101ULL) & ~q)
                 | ((b - 0x0101010101010101ULL) & ~b)) & 0x8080808080808080ULL) break;
            i += 8;
        }
        return i;
    }
    #endif
    """
    Py_ssize_t at_plain_run(const uint8_t*, Py_ssize_t) nogil

cdef extern from "Python.h":
    object PyUnicode_DecodeASCII(const char* s, Py_ssize_t size, const char* errors)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    bint PyUnicode_IS_ASCII(object)
    int PyUnicode_Tailmatch(object, object, Py_ssize_t, Py_ssize_t, int) except -1
    char* PyOS_double_to_string(double, char, int, int, int*) except NULL
    int Py_DTSF_ADD_DOT_0
    double PyFloat_AS_DOUBLE(object)
    object PyMemoryView_FromMemory(char*, Py_ssize_t, int)
    int PyBUF_READ

cdef object _OrderedDict = OrderedDict
cdef frozenset _CONTENT = semconv.CONTENT_KEYS
cdef object _urandom = os.urandom
# The salt pool: random bytes handed out 16 at a time, each once (refilled between spans, never
# inside one, so that no Python code runs while a span's borrowed keys and values are written).
cdef enum:
    _SALT = 16
    _POOL = 4096
cdef bytes _pool = b""
cdef Py_ssize_t _pool_off = _POOL
cdef str _CHAIN_PREFIX = "agenttape.chain."
cdef Py_ssize_t _STACK = 8192
cdef extern from "_sha256.h":
    int at_sha256_available()
    void at_sha256(const unsigned char*, size_t, unsigned char*) nogil

cdef object _sha256 = hashlib.sha256
cdef bint _DIRECT = at_sha256_available()  # OpenSSL's SHA-256 called directly, else through hashlib
# As merkle.leaf_hash: hashlib lets go of the GIL for an update of 2 KiB or more; leaves up to
# _KEEP_GIL are fed in pieces below that size, larger ones in one update.
cdef Py_ssize_t _PIECE = 2040
cdef Py_ssize_t _KEEP_GIL = 64 * 1024


class _Bail(Exception):
    """A value the compiled path leaves to the Python path."""


# --- the output buffer ----------------------------------------------------------------------------

cdef struct Buf:
    char* p
    Py_ssize_t n
    Py_ssize_t cap
    bint heap


cdef int _grow(Buf* b, Py_ssize_t need) except -1:
    cdef Py_ssize_t cap = b.cap * 2
    cdef char* p
    while cap < b.n + need:
        cap *= 2
    if b.heap:
        p = <char*>PyMem_Realloc(b.p, cap)
    else:
        p = <char*>PyMem_Malloc(cap)
        if p != NULL:
            memcpy(p, b.p, b.n)
    if p == NULL:
        raise MemoryError()
    b.p = p
    b.cap = cap
    b.heap = True
    return 0


cdef inline int _reserve(Buf* b, Py_ssize_t need) except -1:
    if b.n + need > b.cap:
        return _grow(b, need)
    return 0


cdef inline int _put(Buf* b, const char* s, Py_ssize_t n) except -1:
    _reserve(b, n)
    memcpy(b.p + b.n, s, n)
    b.n += n
    return 0


cdef inline int _lit(Buf* b, bytes s) except -1:
    return _put(b, <const char*>s, len(s))


# --- numbers and ids --------------------------------------------------------------------------------

cdef int _u64(Buf* b, uint64_t u) except -1:
    cdef char tmp[24]
    cdef int i = 24
    if u == 0:
        return _put(b, "0", 1)
    while u:
        i -= 1
        tmp[i] = <char>(48 + u % 10)
        u //= 10
    return _put(b, tmp + i, 24 - i)


cdef int _i64(Buf* b, object v) except -1:
    """The decimal of an exact int within int64 (as ``str(v)``); anything else bails."""
    cdef int overflow = 0
    cdef long long x
    if type(v) is not int:
        raise _Bail
    x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow:
        raise _Bail
    if x < 0:
        _put(b, "-", 1)
        return _u64(b, <uint64_t>0 - <uint64_t>x)
    return _u64(b, <uint64_t>x)


cdef const char* _HEX = "0123456789abcdef"


cdef int _hex64(Buf* b, uint64_t u) except -1:
    cdef int i
    _reserve(b, 16)
    for i in range(15, -1, -1):
        b.p[b.n + i] = _HEX[u & 15]
        u >>= 4
    b.n += 16
    return 0


cdef uint64_t _id64(object v) except? 0xFFFFFFFFFFFFFFFF:
    """An exact int within [0, 2**64); anything else bails."""
    if type(v) is not int:
        raise _Bail
    try:
        return PyLong_AsUnsignedLongLong(v)
    except OverflowError:
        raise _Bail


cdef int _span_id(Buf* b, object v) except -1:
    _put(b, "\"", 1)
    _hex64(b, _id64(v))
    return _put(b, "\"", 1)


cdef int _trace_id(Buf* b, object v) except -1:
    if type(v) is not int:
        raise _Bail
    _put(b, "\"", 1)
    _hex64(b, _id64(v >> 64))
    _hex64(b, _id64(v & 0xFFFFFFFFFFFFFFFF))
    return _put(b, "\"", 1)


# --- strings ----------------------------------------------------------------------------------------

cdef uint8_t _ESC[128]
cdef int _c
for _c in range(128):
    _ESC[_c] = 1 if (_c < 0x20 or _c == 0x22 or _c == 0x5C) else 0


cdef inline int _escape(Buf* b, uint32_t c) except -1:
    _reserve(b, 6)
    cdef char* p = b.p + b.n
    p[0] = 92  # backslash
    if c == 0x22 or c == 0x5C:
        p[1] = <char>c
        b.n += 2
    elif c == 8:
        p[1] = 98  # b
        b.n += 2
    elif c == 9:
        p[1] = 116  # t
        b.n += 2
    elif c == 10:
        p[1] = 110  # n
        b.n += 2
    elif c == 12:
        p[1] = 102  # f
        b.n += 2
    elif c == 13:
        p[1] = 114  # r
        b.n += 2
    else:
        p[1] = 117  # u
        p[2] = 48
        p[3] = 48
        p[4] = _HEX[c >> 4]
        p[5] = _HEX[c & 15]
        b.n += 6
    return 0


cdef int _ascii(Buf* b, const uint8_t* s, Py_ssize_t n) except -1:
    cdef Py_ssize_t i = 0, start = 0
    _reserve(b, n + 2)
    b.p[b.n] = 34
    b.n += 1
    while True:
        i += at_plain_run(s + i, n - i)  # whole words up to the one holding the next special byte
        while i < n and not _ESC[s[i]]:
            i += 1
        if i >= n:
            break
        _reserve(b, (n - start) + 7)  # the run, the escape and the rest
        memcpy(b.p + b.n, s + start, i - start)
        b.n += i - start
        _escape(b, s[i])
        i += 1
        start = i
    _reserve(b, (n - start) + 1)
    memcpy(b.p + b.n, s + start, n - start)
    b.n += n - start
    b.p[b.n] = 34
    b.n += 1
    return 0


cdef int _text(Buf* b, object s) except -1:
    """A JSON string as orjson writes it; a surrogate code point bails (it has no UTF-8 form)."""
    cdef Py_ssize_t n, i
    cdef int kind
    cdef void* data
    cdef uint32_t c
    cdef char* p
    AT_UNICODE_READY(s)
    n = PyUnicode_GET_LENGTH(s)
    data = PyUnicode_DATA(s)
    if PyUnicode_IS_ASCII(s):
        return _ascii(b, <const uint8_t*>data, n)
    kind = PyUnicode_KIND(s)
    _reserve(b, n * 6 + 2)  # 4 bytes per character at most, 6 for an escaped control character
    p = b.p
    p[b.n] = 34
    b.n += 1
    for i in range(n):
        if kind == 1:
            c = (<const uint8_t*>data)[i]
        elif kind == 2:
            c = (<const uint16_t*>data)[i]
        else:
            c = (<const uint32_t*>data)[i]
        if c < 0x80:
            if _ESC[c]:
                _escape(b, c)  # within the reservation: p stays valid
            else:
                p[b.n] = <char>c
                b.n += 1
        elif c < 0x800:
            p[b.n] = <char>(0xC0 | (c >> 6))
            p[b.n + 1] = <char>(0x80 | (c & 0x3F))
            b.n += 2
        elif c < 0x10000:
            if 0xD800 <= c <= 0xDFFF:
                raise _Bail
            p[b.n] = <char>(0xE0 | (c >> 12))
            p[b.n + 1] = <char>(0x80 | ((c >> 6) & 0x3F))
            p[b.n + 2] = <char>(0x80 | (c & 0x3F))
            b.n += 3
        else:
            p[b.n] = <char>(0xF0 | (c >> 18))
            p[b.n + 1] = <char>(0x80 | ((c >> 12) & 0x3F))
            p[b.n + 2] = <char>(0x80 | ((c >> 6) & 0x3F))
            p[b.n + 3] = <char>(0x80 | (c & 0x3F))
            b.n += 4
    p[b.n] = 34
    b.n += 1
    return 0


cdef int _str(Buf* b, object s) except -1:
    if type(s) is not str:
        raise _Bail
    return _text(b, s)


# --- typed attribute values --------------------------------------------------------------------------

cdef int _double(Buf* b, object v) except -1:
    cdef double d = PyFloat_AS_DOUBLE(v)
    cdef char* r
    if isnan(d):
        return _lit(b, b'{"d":"NaN"}')
    if isinf(d):
        return _lit(b, b'{"d":"Infinity"}' if d > 0 else b'{"d":"-Infinity"}')
    r = PyOS_double_to_string(d, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)  # what repr(float) writes
    try:
        _put(b, '{"d":"', 6)
        _put(b, r, len(<bytes>r))
        _put(b, '"}', 2)
    finally:
        PyMem_Free(r)
    return 0


cdef int _scalar(Buf* b, object v) except -1:
    """A typed value other than a string or an array (``leaf_fast._fast_other``)."""
    t = type(v)
    if t is int:
        _put(b, '{"i":"', 6)
        _i64(b, v)
        return _put(b, '"}', 2)
    if t is float:
        return _double(b, v)
    if t is bool:
        return _lit(b, b'{"bool":true}' if v is True else b'{"bool":false}')
    if v is None:
        return _put(b, "{}", 2)
    raise _Bail


cdef int _array(Buf* b, object v) except -1:
    cdef bint first = True
    _put(b, '{"a":[', 6)
    for x in v:
        if not first:
            _put(b, ",", 1)
        first = False
        t = type(x)
        if t is str:
            _put(b, '{"s":', 5)
            _text(b, x)
            _put(b, "}", 1)
        elif t is tuple or t is list:
            raise _Bail  # nested arrays: the general path
        else:
            _scalar(b, x)
    return _put(b, "]}", 2)


cdef int _value(Buf* b, object v) except -1:
    t = type(v)
    if t is str:
        _put(b, '{"s":', 5)
        _text(b, v)
        return _put(b, "}", 1)
    if t is tuple or t is list:
        return _array(b, v)
    return _scalar(b, v)


cdef bint _fit_key(object k, bint skip_chain) except -1:
    """Whether a key can be ordered by code point: an exact str without characters above U+FFFF (a
    canonical str holds one exactly when it is of the 4-byte kind)."""
    if type(k) is not str:
        return False
    AT_UNICODE_READY(k)
    if PyUnicode_KIND(k) == 4:
        return False
    if skip_chain and PyUnicode_GET_LENGTH(k) >= 16 and PyUnicode_Tailmatch(k, _CHAIN_PREFIX, 0, 16, -1):
        return False
    return True


cdef enum:
    _MAX_KEYS = 64  # attribute sets up to this size are written from C arrays in a remembered order


cdef class _KeyOrder:
    """The code-point order of the last attribute set seen in one role, keyed by its key objects in
    dict order: instrumentations set the same constant keys span after span, so the keys are usually
    the very same objects and need neither the checks nor the sort again."""

    cdef list seen  # the key objects (held, so that their addresses are not reused)
    cdef Py_ssize_t n
    cdef Py_ssize_t perm[_MAX_KEYS]  # dict positions in code-point order of their keys
    cdef bint content[_MAX_KEYS]  # whether the key at perm[j] is a content key

    def __cinit__(self):
        self.seen = []
        self.n = -1

    cdef inline bint hit(self, PyObject** keys, Py_ssize_t n):
        cdef Py_ssize_t i
        if n != self.n:
            return False
        for i in range(n):
            if keys[i] != PyList_GET_ITEM(self.seen, i):
                return False
        return True

    cdef int learn(self, PyObject** keys, Py_ssize_t n, bint skip_chain) except -1:
        cdef Py_ssize_t i
        seen = [<object>keys[i] for i in range(n)]
        for key in seen:
            if not _fit_key(key, skip_chain):
                raise _Bail
        order = sorted(range(n), key=seen.__getitem__)
        for i in range(n):
            self.perm[i] = order[i]
            self.content[i] = seen[order[i]] in _CONTENT
        self.seen = seen
        self.n = n
        return 0


cdef _KeyOrder _SPAN_ORDER = _KeyOrder()
cdef _KeyOrder _OTHER_ORDER = _KeyOrder()


cdef inline Py_ssize_t _collect(object attrs, PyObject** ks, PyObject** vs):
    cdef Py_ssize_t pos = 0, i = 0
    cdef PyObject* k
    cdef PyObject* v
    while i < _MAX_KEYS and PyDict_Next(attrs, &pos, &k, &v):
        ks[i] = k
        vs[i] = v
        i += 1
    return i


cdef int _committed(Buf* b, object v, list found, Py_ssize_t ev, object key) except -1:
    """``{"c":"<hex sha256(salt || typed value)>"}`` with the next salt of the pool (leaf v2); the
    salts are taken in order from the pool, so ``found`` keeps only ``(event index or -1, key)``."""
    global _pool_off
    cdef char stack[4096]
    cdef Buf t
    cdef unsigned char dig[32]
    cdef int i
    if _pool_off + _SALT > _POOL or not _DIRECT:
        raise _Bail  # the pool ran out within one span, or no direct SHA-256: the Python path
    t.p = stack
    t.n = 0
    t.cap = 4096
    t.heap = False
    try:
        _put(&t, (<char*>_pool) + _pool_off, _SALT)
        found.append(key if ev < 0 else (ev, key))
        _pool_off += _SALT
        _value(&t, v)
        at_sha256(<const unsigned char*>t.p, t.n, dig)
    finally:
        if t.heap:
            PyMem_Free(t.p)
    _reserve(b, 72)
    memcpy(b.p + b.n, b'{"c":"', 6)
    b.n += 6
    for i in range(32):
        b.p[b.n] = _HEX[dig[i] >> 4]
        b.p[b.n + 1] = _HEX[dig[i] & 15]
        b.n += 2
    return _put(b, '"}', 2)


cdef int _attrs(Buf* b, object attrs, bint skip_chain, list found=None, Py_ssize_t ev=-1) except -1:
    """A plain dict of attributes in code-point key order (``leaf_fast._fast_attrs``); with ``found``,
    content values are written as commitments and ``(event index or -1, key, salt)`` appended."""
    cdef PyObject* ks[_MAX_KEYS]
    cdef PyObject* vs[_MAX_KEYS]
    cdef Py_ssize_t n, j, idx
    cdef _KeyOrder order
    if attrs is None or not attrs:
        return _put(b, "{}", 2)
    t = type(attrs)
    if t is not dict and t is not _OrderedDict:
        raise _Bail
    n = len(attrs)
    if n > _MAX_KEYS:
        return _attrs_sorted(b, attrs, skip_chain, found, ev)
    order = _SPAN_ORDER if skip_chain else _OTHER_ORDER
    if _collect(attrs, ks, vs) != n:
        raise _Bail
    if not order.hit(ks, n):
        order.learn(ks, n, skip_chain)
        if _collect(attrs, ks, vs) != n or not order.hit(ks, n):  # (learning ran Python code)
            raise _Bail
    # From here no Python code runs until the set is written: the borrowed keys and values stay valid.
    _put(b, "{", 1)
    for j in range(n):
        if j:
            _put(b, ",", 1)
        idx = order.perm[j]
        _text(b, <object>ks[idx])
        _put(b, ":", 1)
        if found is not None and order.content[j]:
            _committed(b, <object>vs[idx], found, ev, <object>ks[idx])
        else:
            _value(b, <object>vs[idx])
    return _put(b, "}", 1)


cdef int _attrs_sorted(Buf* b, object attrs, bint skip_chain, list found, Py_ssize_t ev) except -1:
    """A large attribute set: checked and sorted each time."""
    cdef list keys = list((<dict>attrs).keys())
    cdef PyObject* v
    for k in keys:
        if not _fit_key(k, skip_chain):
            raise _Bail
    cdef bint first = True
    PyList_Sort(keys)
    _put(b, "{", 1)
    for k in keys:
        if not first:
            _put(b, ",", 1)
        first = False
        _text(b, k)
        _put(b, ":", 1)
        v = PyDict_GetItem(attrs, k)
        if v == NULL:
            raise _Bail
        if found is not None and k in _CONTENT:
            _committed(b, <object>v, found, ev, k)
        else:
            _value(b, <object>v)
    return _put(b, "}", 1)


cdef object _plain(object holder):
    """The plain dict behind an attribute holder, or what stands for it (``leaf.raw_attributes``)."""
    attrs = getattr(holder, "_attributes", None)
    if attrs is None:
        attrs = holder.attributes
    if type(attrs) is dict:
        return attrs
    inner = getattr(attrs, "_dict", None)
    return inner if inner is not None else attrs


cdef object _items(object seq):
    """The items of an SDK ``BoundedList`` (its deque), or of a tuple / list."""
    t = type(seq)
    if t is tuple or t is list or seq is None:
        return seq
    return getattr(seq, "_dq", seq)


# --- the span ----------------------------------------------------------------------------------------
#
# The SDK's span context, status and trace state are read through properties; where this module can
# see that those properties return plain fields (checked once, on probe objects, at import), it reads
# the fields. A type it does not know exactly (a subclass, another SDK) goes through the properties.

cdef object _SpanContext = None
cdef object _Status = None
cdef object _TraceState = None
cdef object _BoundedAttributes = None
cdef object _BoundedList = None
cdef tuple _DROPPED = ("dropped_attributes", "dropped_events", "dropped_links")
cdef dict _PLAIN_DROPPED = {}  # span type -> whether its dropped_* are ReadableSpan's properties
cdef object _READABLE = None


def _probe_layouts() -> None:
    """The SDK types whose fields a probe showed to be what their properties return
    (``codec/sdk_layout.py``); none when it showed otherwise."""
    global _SpanContext, _Status, _TraceState, _BoundedAttributes, _BoundedList, _READABLE
    from otel_agenttape.codec.sdk_layout import LAYOUT

    if LAYOUT is not None:
        _SpanContext, _Status, _TraceState = LAYOUT.span_context, LAYOUT.status, LAYOUT.trace_state
        _BoundedAttributes, _BoundedList, _READABLE = LAYOUT.bounded_attributes, LAYOUT.bounded_list, LAYOUT.readable_span


_probe_layouts()


def verified_span_context() -> type | None:
    """The SDK's ``SpanContext`` when its fields were found at tuple positions 0 (trace id), 1 (span id)
    and 4 (trace state), else ``None``."""
    return _SpanContext


cdef bint _plain_dropped(object tp):
    r = _PLAIN_DROPPED.get(tp)
    if r is None:
        r = _READABLE is not None and all(getattr(tp, n, None) is getattr(_READABLE, n) for n in _DROPPED)
        if len(_PLAIN_DROPPED) < 64:
            _PLAIN_DROPPED[tp] = r
    return r


cdef inline object _dropped(object holder, object bounded):
    return holder.dropped if isinstance(holder, bounded) else 0


cdef int _span(Buf* b, object span, list found=None) except -1:
    cdef bint first
    cdef bint plain = _plain_dropped(type(span))
    cdef Py_ssize_t ev = 0
    _put(b, '{"attributes":', 14)
    _attrs(b, _plain(span), True, found, -1)
    _put(b, ',"dropped_attributes_count":', 28)
    _i64(b, _dropped(span._attributes, _BoundedAttributes) if plain else span.dropped_attributes)
    _put(b, ',"dropped_events_count":', 24)
    _i64(b, _dropped(span._events, _BoundedList) if plain else span.dropped_events)
    _put(b, ',"dropped_links_count":', 23)
    _i64(b, _dropped(span._links, _BoundedList) if plain else span.dropped_links)
    _put(b, ',"end_time_unix_nano":"', 23)
    _i64(b, span._end_time)
    _put(b, '","events":[', 12)
    evs = _items(span._events)
    if evs:
        first = True
        for e in evs:
            if not first:
                _put(b, ",", 1)
            first = False
            _put(b, '{"attributes":', 14)
            ea = e._attributes
            if type(ea) is not dict:
                ea = getattr(ea, "_dict", ea)
            _attrs(b, ea, False, found, ev)  # a falsy holder: {}
            ev += 1
            _put(b, ',"dropped_attributes_count":', 28)
            _i64(b, e.dropped_attributes)
            _put(b, ',"name":', 8)
            _str(b, e._name)
            _put(b, ',"time_unix_nano":"', 19)
            _i64(b, e._timestamp)
            _put(b, '"}', 2)
    _put(b, '],"kind":', 9)
    _i64(b, span._kind._value_ + 1)
    _put(b, ',"links":[', 10)
    lks = _items(span._links)
    if lks:
        first = True
        for lk in lks:
            if not first:
                _put(b, ",", 1)
            first = False
            _put(b, '{"attributes":', 14)
            _attrs(b, _plain(lk), False)
            _put(b, ',"dropped_attributes_count":', 28)
            _i64(b, lk.dropped_attributes)
            lctx = lk.context
            _put(b, ',"span_id":', 11)
            _span_id(b, lctx.span_id)
            _put(b, ',"trace_id":', 12)
            _trace_id(b, lctx.trace_id)
            _put(b, "}", 1)
    _put(b, '],"name":', 9)
    _str(b, span._name)
    _put(b, ',"parent_span_id":', 18)
    parent = span._parent
    if parent is None:
        _put(b, '""', 2)
    elif type(parent) is _SpanContext:
        _span_id(b, <object>PyTuple_GET_ITEM(parent, 1))
    else:
        _span_id(b, parent.span_id)
    trace_id, span_id, ts = context_fields(span._context, _SpanContext)
    _put(b, ',"span_id":', 11)
    _span_id(b, span_id)
    _put(b, ',"start_time_unix_nano":"', 25)
    _i64(b, span._start_time)
    status = span._status
    if type(status) is _Status:
        code = status._status_code
        message = status._description
    else:
        code = status.status_code
        message = status.description
    _put(b, '","status":{"code":', 19)
    _i64(b, code._value_)
    _put(b, ',"message":', 11)
    _str(b, message or "")
    _put(b, '},"trace_id":', 13)
    _trace_id(b, trace_id)
    _put(b, ',"trace_state":', 15)
    if type(ts) is _TraceState:
        ts = ts._dict  # the same pairs, in the same order
    _str(b, ",".join([f"{k}={v}" for k, v in ts.items()]) if ts else "")
    if found:
        return _put(b, ',"v":2}', 7)  # a leaf that commits to content is v2
    return _put(b, ',"v":1}', 7)


cdef inline void _open(Buf* b, char* stack):
    b.p = stack
    b.p[0] = 0  # the Merkle leaf prefix, before the leaf
    b.n = 1
    b.cap = _STACK
    b.heap = False


def use_direct_sha256(on: bool) -> bool:
    """Hash with libcrypto called directly (when found) or through hashlib; returns whether it now does directly.
    Both give the same bytes: tests run both."""
    global _DIRECT
    _DIRECT = bool(on) and at_sha256_available()
    return _DIRECT


def leaf_sdk(span: object) -> bytes | None:
    """The canonical leaf bytes of an SDK span, or ``None`` for what the Python path must decide."""
    cdef char stack[8192]
    cdef Buf b
    _open(&b, stack)
    try:
        _span(&b, span)
        return PyBytes_FromStringAndSize(b.p + 1, b.n - 1)
    except Exception:  # _Bail, or a span of another layout: the Python path decides
        return None
    finally:
        if b.heap:
            PyMem_Free(b.p)


def leaf_hash_sdk(span: object) -> bytes | None:
    """``SHA-256(0x00 || leaf_sdk(span))``, the span's Merkle leaf hash (``None`` as for ``leaf_sdk``)."""
    cdef char stack[8192]
    cdef Buf b
    cdef Py_ssize_t off, n
    cdef unsigned char dig[32]
    _open(&b, stack)
    try:
        try:
            _span(&b, span)
        except Exception:  # as in leaf_sdk
            return None
        n = b.n
        if _DIRECT:
            if n > _KEEP_GIL:
                with nogil:  # a large leaf: hashed while other threads run Python code
                    at_sha256(<const unsigned char*>b.p, n, dig)
            else:
                at_sha256(<const unsigned char*>b.p, n, dig)
            return PyBytes_FromStringAndSize(<char*>dig, 32)
        if n <= _PIECE or n > _KEEP_GIL:
            return _sha256(PyMemoryView_FromMemory(b.p, n, PyBUF_READ)).digest()
        h = _sha256(PyMemoryView_FromMemory(b.p, _PIECE, PyBUF_READ))
        off = _PIECE
        while off < n:
            h.update(PyMemoryView_FromMemory(b.p + off, min(_PIECE, n - off), PyBUF_READ))
            off += _PIECE
        return h.digest()
    finally:
        if b.heap:
            PyMem_Free(b.p)


def seal_hash_sdk(span: object) -> tuple | None:
    """``(Merkle leaf hash, agenttape.chain.salts text or None)`` of a span sealed as leaf v2 with fresh
    salts for its content values (``leaf_fast.python_seal_hash_sdk``), or ``None`` for the Python path."""
    global _pool, _pool_off
    cdef char stack[8192]
    cdef Buf b
    cdef Buf t
    cdef unsigned char dig[32]
    cdef list found = []
    cdef char tstack[512]
    cdef Py_ssize_t start, off
    if _pool_off > _POOL - 64 * _SALT:  # room for 64 values; a span with more refills next time
        _pool = _urandom(_POOL)
        _pool_off = 0
    start = _pool_off
    _open(&b, stack)
    try:
        try:
            _span(&b, span, found)
        except Exception:  # as in leaf_sdk (the salts taken are thrown away, never reused)
            return None
        if _DIRECT:
            at_sha256(<const unsigned char*>b.p, b.n, dig)
            lh = PyBytes_FromStringAndSize(<char*>dig, 32)
        else:
            lh = _sha256(PyMemoryView_FromMemory(b.p, b.n, PyBUF_READ)).digest()
    finally:
        if b.heap:
            PyMem_Free(b.p)
    if not found:
        return lh, None
    t.p = tstack
    t.n = 0
    t.cap = 512
    t.heap = False
    try:
        _put(&t, "{", 1)
        off = start
        for item in found:
            if off != start:
                _put(&t, ",", 1)
            if type(item) is tuple:
                _text(&t, f"event:{(<tuple>item)[0]}:{(<tuple>item)[1]}")
            else:
                _text(&t, item)
            _put(&t, ':"', 2)
            _hex_mem(&t, (<const unsigned char*><char*>_pool) + off, _SALT)
            off += _SALT
            _put(&t, '"', 1)
        _put(&t, "}", 1)
        if _ascii_only(t.p, t.n):
            return lh, PyUnicode_DecodeASCII(t.p, t.n, NULL)
        return lh, (<bytes>PyBytes_FromStringAndSize(t.p, t.n)).decode("utf-8")
    finally:
        if t.heap:
            PyMem_Free(t.p)


cdef bint _ascii_only(const char* p, Py_ssize_t n):
    cdef Py_ssize_t i
    for i in range(n):
        if (<const unsigned char>p[i]) >= 0x80:
            return False
    return True


cdef int _hex_mem(Buf* b, const unsigned char* p, Py_ssize_t n) except -1:
    cdef Py_ssize_t i
    _reserve(b, 2 * n)
    for i in range(n):
        b.p[b.n] = _HEX[p[i] >> 4]
        b.p[b.n + 1] = _HEX[p[i] & 15]
        b.n += 2
    return 0


def seal_hash_v1_sdk(span: object) -> tuple | None:
    """``(leaf_hash_sdk(span), None)``: sealing with no content keys (v1 leaves), or ``None``."""
    lh = leaf_hash_sdk(span)
    return None if lh is None else (lh, None)
