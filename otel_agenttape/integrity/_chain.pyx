# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled ``Chain.append_hash``: the chain link and the Merkle tree update of one sealed span.

The same rule as ``chain.Chain.append_hash`` (``sha256(prev || "|" || hex(leaf_hash))`` in lowercase
hex, then an RFC 9162 compact-range append with ``SHA-256(0x01 || left || right)`` nodes), with the
hashes' inputs put together in a C buffer instead of Python strings and bytes. SHA-256 is
OpenSSL's, called directly (``_sha256.h``) where hashlib's libcrypto exports it, else through hashlib. ``tests/test_chain_native.py``
compares both on the same leaf hashes.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcmp, memcpy

import hashlib

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    void* PyUnicode_DATA(object)
    object PyMemoryView_FromMemory(char*, Py_ssize_t, int)
    str PyUnicode_DecodeLatin1(const char*, Py_ssize_t, const char*)
    int PyBUF_READ

cdef extern from *:
    """
    #if PY_VERSION_HEX < 0x030C0000
    #define AT_UNICODE_READY(o) PyUnicode_READY(o)
    #else
    #define AT_UNICODE_READY(o) 0
    #endif
    """
    int AT_UNICODE_READY(object) except -1

cdef extern from "_sha256.h":
    int at_sha256_available()
    void at_sha256(const unsigned char*, size_t, unsigned char*) nogil

cdef object _sha256 = hashlib.sha256
cdef bint _DIRECT = at_sha256_available()
cdef const char* _HEX = "0123456789abcdef"
cdef object _tuple_new = tuple.__new__
cdef object _Link = tuple


def sha256(data: bytes) -> bytes | None:
    """SHA-256 of ``data`` by libcrypto called directly (``_sha256.h``), or ``None`` where it cannot be."""
    cdef unsigned char dig[32]
    if not _DIRECT:
        return None
    at_sha256(<const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), dig)
    return PyBytes_FromStringAndSize(<char*>dig, 32)


def use_direct_sha256(on: bool) -> bool:
    """Hash with libcrypto called directly (when found) or through hashlib; returns whether it now does directly.
    Both give the same bytes: tests run both."""
    global _DIRECT
    _DIRECT = bool(on) and at_sha256_available()
    return _DIRECT


def set_link_type(link_type: type) -> None:
    """The named tuple ``append_hash`` returns (``chain.Link``; chain.py sets it at import)."""
    global _Link
    _Link = link_type


cdef str _link(str prev, bytes lh):
    """``sha256(prev || "|" || hex(lh)).hexdigest()`` for a 64-character ASCII ``prev`` and 32-byte ``lh``."""
    cdef char buf[129]
    cdef const unsigned char* h
    cdef int i
    AT_UNICODE_READY(prev)
    if PyUnicode_GET_LENGTH(prev) != 64 or not PyUnicode_IS_ASCII(prev) or PyBytes_GET_SIZE(lh) != 32:
        return None
    memcpy(buf, PyUnicode_DATA(prev), 64)
    buf[64] = 124  # |
    h = <const unsigned char*>PyBytes_AS_STRING(lh)
    for i in range(32):
        buf[65 + 2 * i] = _HEX[h[i] >> 4]
        buf[66 + 2 * i] = _HEX[h[i] & 15]
    if not _DIRECT:
        return _sha256(PyMemoryView_FromMemory(buf, 129, PyBUF_READ)).hexdigest()
    cdef unsigned char dig[32]
    cdef char out[64]
    at_sha256(<const unsigned char*>buf, 129, dig)
    for i in range(32):
        out[2 * i] = _HEX[dig[i] >> 4]
        out[2 * i + 1] = _HEX[dig[i] & 15]
    return PyUnicode_DecodeLatin1(out, 64, NULL)


cdef bytes _node(object left, object right):
    cdef char buf[65]
    if type(left) is not bytes or PyBytes_GET_SIZE(left) != 32 or type(right) is not bytes or PyBytes_GET_SIZE(right) != 32:
        return _sha256(b"\x01" + left + right).digest()  # not two hashes: as merkle.py does it
    buf[0] = 1
    memcpy(buf + 1, PyBytes_AS_STRING(left), 32)
    memcpy(buf + 33, PyBytes_AS_STRING(right), 32)
    if not _DIRECT:
        return _sha256(PyMemoryView_FromMemory(buf, 65, PyBUF_READ)).digest()
    cdef unsigned char dig[32]
    at_sha256(<const unsigned char*>buf, 65, dig)
    return PyBytes_FromStringAndSize(<char*>dig, 32)


def tree_append(tree: object, lh: bytes) -> None:
    """``merkle.CompactRange.append``."""
    cdef Py_ssize_t n = tree.size
    cdef list stack = tree._stack
    cdef bytes h
    tree.size = n + 1
    if not n & 1:
        stack.append(lh)
        return
    h = _node(stack.pop(), lh)
    n >>= 1
    while n & 1:
        h = _node(stack.pop(), h)
        n >>= 1
    stack.append(h)


def tree_extend(list stack, Py_ssize_t size, object leaf_hashes) -> int:
    """``merkle.CompactRange.extend`` on its stack and size (given explicitly): each leaf hash appended
    in order; returns the new size."""
    cdef Py_ssize_t n = size, m
    cdef bytes h
    for lh in leaf_hashes:
        if not n & 1:
            stack.append(lh)
        else:
            h = _node(stack.pop(), lh)
            m = n >> 1
            while m & 1:
                h = _node(stack.pop(), h)
                m >>= 1
            stack.append(h)
        n += 1
    return n


def append_hash(chain: object, lh: bytes):
    """``Chain.append_hash``: the ``chain.Link`` of the new entry."""
    prev = chain.head
    h = None
    if type(prev) is str and type(lh) is bytes:
        h = _link(<str>prev, <bytes>lh)
    if h is None:  # not a 64-character head and a 32-byte hash: the Python method
        return chain.python_append_hash(lh)
    seq = chain.size
    tree_append(chain.tree, lh)
    chain.head = h
    chain.size = seq + 1
    return _tuple_new(_Link, (chain.chain_id, chain.epoch, seq, prev, h))


# --- leaf v2: salted commitments for the verifier's fast path (``tape/sealed_entries._commit``) ------

import orjson as _orjson

cdef object _json_loads = _orjson.loads
cdef object _json_dumps = _orjson.dumps
cdef object _SORT_KEYS = _orjson.OPT_SORT_KEYS
cdef enum:
    _COMMIT_STACK = 4096


cdef inline int _unhex(char c):
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    return -1  # upper case, spaces or anything else: the reference refuses the salt


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*) except NULL

cdef extern from *:
    """
    /* sha256(salt || '{"s":"' || escaped(p[0:n]) || '"}'): the value's bytes as orjson writes them. */
    static void at_hash_text(const unsigned char *salt, const unsigned char *p, size_t n, unsigned char *dig) {
        at_hw w;
        static const unsigned char open_s[6] = {123, 34, 115, 34, 58, 34};  /* {"s":" */
        static const unsigned char close_s[2] = {34, 125};  /* "} */
        at_hw_init(&w);
        at_hw_put(&w, salt, 16);
        at_hw_put(&w, open_s, 6);
        at_hw_escaped(&w, p, n);
        at_hw_put(&w, close_s, 2);
        at_hw_final(&w, dig);
    }
    """
    void at_hash_text(const unsigned char*, const unsigned char*, size_t, unsigned char*) nogil


cdef int _hash_text_value(const unsigned char* salt, object text, unsigned char* dig) except -1:
    r"""``sha256(salt || orjson.dumps({"s": text}))`` without building the value's bytes (``at_hash_text``:
    orjson's string escapes, the rest as UTF-8); 0 when ``text`` is not valid UTF-8 (a lone surrogate:
    the caller lets orjson refuse it)."""
    cdef Py_ssize_t n
    cdef const unsigned char* p
    if PyUnicode_IS_ASCII(text):
        p = <const unsigned char*>PyUnicode_DATA(text)
        n = PyUnicode_GET_LENGTH(text)
    else:
        try:
            p = <const unsigned char*>PyUnicode_AsUTF8AndSize(text, &n)
        except UnicodeError:
            return 0
    at_hash_text(salt, p, n, dig)
    return 1


cdef object _simple_salts(object text):
    """The labels of a salts text written as ``salts_text`` writes it (``{"label":"hex",...}``, no
    escapes, no spaces) with the offset of each one's 32 hex digits in the text, as a list of pairs;
    ``None`` for any other text (orjson then parses it)."""
    cdef Py_ssize_t n, i, j, k
    cdef const char* p
    if type(text) is not str or not PyUnicode_IS_ASCII(text):
        return None
    p = <const char*>PyUnicode_DATA(text)
    n = PyUnicode_GET_LENGTH(text)
    if n < 2 or p[0] != 123 or p[n - 1] != 125:
        return None
    out = []
    i = 1
    if n == 2:
        return out
    while True:
        if p[i] != 34:
            return None
        j = i + 1
        while j < n and p[j] != 34:
            if p[j] == 92 or p[j] < 32:  # an escape or a raw control (orjson refuses those)
                return None
            j += 1
        # "label":"<32>"
        if j + 36 >= n or p[j + 1] != 58 or p[j + 2] != 34 or p[j + 35] != 34:
            return None
        label = PyUnicode_DecodeLatin1(p + i + 1, j - i - 1, NULL)
        for other, _ in out:
            if other == label:
                return None  # a repeated label: orjson's reading (the last one) decides
        out.append((label, j + 3))
        i = j + 36
        if p[i] == 125 and i == n - 1:
            return out
        if p[i] != 44:
            return None
        i += 1


# The layout of the last salts text read by ``_simple_salts``: (text, offsets of its salts, where each
# label's value is). The rows of a tape carry the same labels in the same order, so a text equal to it
# outside its 32-digit salts is read without parsing it again. Only a cache: a text of another layout
# is parsed, and the salts are checked as digits each time.
cdef object _layout = None


cdef bint _same_layout(object text, tuple lay):
    cdef object ltext = lay[0]
    cdef tuple offs = lay[1]
    cdef Py_ssize_t n, at = 0, off
    cdef const char* p
    cdef const char* q
    if type(text) is not str or not PyUnicode_IS_ASCII(text):
        return False
    n = PyUnicode_GET_LENGTH(text)
    if n != PyUnicode_GET_LENGTH(ltext):
        return False
    p = <const char*>PyUnicode_DATA(text)
    q = <const char*>PyUnicode_DATA(ltext)
    for o in offs:
        off = o
        if memcmp(p + at, q + at, off - at) != 0:
            return False
        at = off + 32
    return memcmp(p + at, q + at, n - at) == 0


cdef int _commit_one(dict a, list events, const char* hp, object where, unsigned char* dig) except -1:
    """Replace the value at ``where`` (event index or None, key) by ``{"c": hex(sha256(salt ||
    its bytes))}``, the salt's 32 hex digits at ``hp``; 0 for a salt the reference refuses."""
    cdef unsigned char salt[16]
    cdef char stack[_COMMIT_STACK]
    cdef char hexed[64]
    cdef const char* vp
    cdef Py_ssize_t i, n
    cdef int hi, lo
    for i in range(16):
        hi = _unhex(hp[2 * i])
        lo = _unhex(hp[2 * i + 1])
        if hi < 0 or lo < 0:
            return 0
        salt[i] = <unsigned char>(hi * 16 + lo)
    idx = (<tuple>where)[0]
    key = (<tuple>where)[1]
    t = a if idx is None else events[idx]["attributes"]
    tv = t[key]
    sv = None
    if type(tv) is dict and len(<dict>tv) == 1:
        sv = (<dict>tv).get("s")
    if type(sv) is not str or not _hash_text_value(salt, sv, dig):
        v = _json_dumps(tv, option=_SORT_KEYS)
        n = PyBytes_GET_SIZE(v)
        vp = PyBytes_AS_STRING(v)
        if n + 16 <= _COMMIT_STACK:
            memcpy(stack, salt, 16)
            memcpy(stack + 16, vp, n)
            at_sha256(<const unsigned char*>stack, n + 16, dig)
        else:
            data = PyBytes_FromStringAndSize(<char*>salt, 16) + v
            at_sha256(<const unsigned char*>PyBytes_AS_STRING(data), n + 16, dig)
    for i in range(32):
        hexed[2 * i] = _HEX[dig[i] >> 4]
        hexed[2 * i + 1] = _HEX[dig[i] & 15]
    t[key] = {"c": PyUnicode_DecodeLatin1(hexed, 64, NULL)}
    return 1


def commit_salts(dict a, list events, object salts_text, dict labels, object label_of):
    """Replace each salted value of the typed sets ``a`` (the span's) and ``events[i]["attributes"]``
    by ``{"c": hex(sha256(salt || orjson-sorted bytes of the value))}``; True when done, False for a
    salts map the reference would refuse (then nothing is promised about ``a``: the caller takes the
    general path), None where SHA-256 is not called directly. Missing values raise (KeyError,
    IndexError): the general path decides. ``labels`` caches ``label_of(label) -> (event index or None,
    key)``. A text value (``{"s": ...}``, the usual content) is hashed as it is serialized, without
    building its bytes."""
    global _layout
    cdef unsigned char dig[32]
    cdef const char* tp
    cdef Py_ssize_t k
    if not _DIRECT:
        return None
    lay = _layout
    if lay is not None and _same_layout(salts_text, <tuple>lay):
        tp = <const char*>PyUnicode_DATA(salts_text)
        offs = (<tuple>lay)[1]
        wheres = (<tuple>lay)[2]
        for k in range(len(<tuple>offs)):
            if not _commit_one(a, events, tp + <Py_ssize_t>(<tuple>offs)[k], (<tuple>wheres)[k], dig):
                return False
        return True
    pairs = _simple_salts(salts_text)
    if pairs is not None:
        wheres = []
        for label, _ in pairs:
            r = labels.get(label)
            if r is None:
                r = label_of(label)
            wheres.append(r)
        _layout = (salts_text, tuple([off for _, off in pairs]), tuple(wheres))
        tp = <const char*>PyUnicode_DATA(salts_text)
        for k, (_, off) in enumerate(pairs):
            if not _commit_one(a, events, tp + <Py_ssize_t>off, wheres[k], dig):
                return False
        return True
    salts = _json_loads(salts_text)
    if type(salts) is not dict:
        return False
    for label, h in (<dict>salts).items():
        if type(h) is not str or not PyUnicode_IS_ASCII(h) or PyUnicode_GET_LENGTH(h) != 32:
            return False
        r = labels.get(label)
        if r is None:
            r = label_of(label)
        if not _commit_one(a, events, <const char*>PyUnicode_DATA(h), r, dig):
            return False
    return True
