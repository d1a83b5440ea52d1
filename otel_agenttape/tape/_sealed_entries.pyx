# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of the fast path in ``sealed_entries.batch_entries``: the leaf of a stored row hashed
as it is read, without building it.

The store keeps a span's attributes as typed JSON in canonical form (sorted keys, orjson's escapes),
which is the leaf's own ``attributes`` text once the ``agenttape.chain.*`` values are taken out and
each salted value is replaced by its commitment. So the leaf ``sealed_entries`` would serialize is
written here straight into SHA-256 from the stored texts and columns: ``0x00``, then the leaf, for
the Merkle leaf hash, then the chain link. A row is taken only when that link is the stored chain
hash (then the bytes hashed are, byte for byte, the sealed leaf, which is also what the Python path
gives) and the ``agenttape.chain.*`` values in its attributes are the ones in its columns, written as
the store writes them. Anything else (links, an erasure, keys out of order or escaped, a text in
another form, a hash that differs) is left to the Python path, which decides: ``batch`` returns None
for such a row. ``tests/test_sealed_entries_native.py`` holds both paths equal.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memchr, memcmp, memcpy
from libc.stdint cimport int32_t, int64_t, uintptr_t

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    void* PyUnicode_DATA(object)
    const char* PyUnicode_AsUTF8AndSize(object, Py_ssize_t*)
    str PyUnicode_DecodeLatin1(const char*, Py_ssize_t, const char*)
    void PyErr_Clear()
    long long PyLong_AsLongLongAndOverflow(object, int*) except? -1

cdef extern from "../integrity/_sha256.h":
    int at_sha256_available()
    void at_sha256(const unsigned char*, size_t, unsigned char*) nogil
    ctypedef struct at_sha_ctx:
        pass
    ctypedef struct at_hw:
        pass
    void at_ctx_init(at_sha_ctx*) nogil
    void at_ctx_update(at_sha_ctx*, const void*, size_t) nogil
    void at_ctx_final(at_sha_ctx*, unsigned char*) nogil
    void at_hw_init(at_hw*) nogil
    void at_hw_put(at_hw*, const void*, size_t) nogil
    void at_hw_final(at_hw*, unsigned char*) nogil
    void at_hw_escaped(at_hw*, const unsigned char*, size_t) nogil

import hashlib as _hashlib  # loads the libcrypto that _sha256.h looks up

cdef bint _DIRECT = at_sha256_available()
cdef const char* _HEX = "0123456789abcdef"
cdef char _HEX2[512]  # each byte's two lower-case hex digits
for _b in range(256):
    _HEX2[2 * _b] = _HEX[_b >> 4]
    _HEX2[2 * _b + 1] = _HEX[_b & 15]


cdef inline void _hex32(char* out, const unsigned char* dig) noexcept nogil:
    """The 64 hex digits of a 32-byte digest, a byte's pair at a time."""
    cdef int i
    for i in range(32):
        memcpy(out + 2 * i, &_HEX2[2 * dig[i]], 2)

cdef enum:
    _MAX_KEYS = 512  # keys of one attribute set read here; a larger set goes to the Python path
    _MAX_SALTS = 64

# what a key of the span's attributes is (the chain values are checked, then left out of the leaf)
cdef enum:
    _KEEP = 0
    _DROP = 1
    _SALTED = 2


cdef struct Text:
    const char* p
    Py_ssize_t n


cdef bint _utf8(object s, Text* t):
    """The UTF-8 bytes of the str ``s`` (False for anything else, or a lone surrogate)."""
    cdef Py_ssize_t n
    if type(s) is not str:
        return False
    if PyUnicode_IS_ASCII(s):
        t.p = <const char*>PyUnicode_DATA(s)
        t.n = PyUnicode_GET_LENGTH(s)
        return True
    t.p = PyUnicode_AsUTF8AndSize(s, &n)
    if t.p == NULL:
        PyErr_Clear()
        return False
    t.n = n
    return True


cdef Py_ssize_t _skip_string(const char* p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The index after the JSON string that opens at ``i``, or -1 (a quote after an odd run of
    backslashes is escaped)."""
    cdef const char* q
    cdef Py_ssize_t j, b
    i += 1
    while i < n:
        q = <const char*>memchr(p + i, 34, n - i)
        if q == NULL:
            return -1
        j = q - p
        b = j - 1
        while b >= i and p[b] == 92:
            b -= 1
        if (j - 1 - b) % 2 == 0:
            return j + 1
        i = j + 1
    return -1


cdef Py_ssize_t _skip_value(const char* p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The index after the JSON value that starts at ``i``, or -1 (brackets are only counted: a text
    that is not JSON gives bytes that hash to no sealed leaf)."""
    cdef int depth = 0
    cdef char c
    cdef Py_ssize_t e
    if i >= n:
        return -1
    c = p[i]
    if c == 34:
        return _skip_string(p, i, n)
    if c == 123 and i + 6 < n and p[i + 1] == 34 and p[i + 3] == 34 and p[i + 4] == 58 and p[i + 5] == 34:
        # the usual typed value, {"<tag>":"<text>"}: its text, then its brace
        e = _skip_string(p, i + 5, n)
        if e > 0 and e < n and p[e] == 125:
            return e + 1
    if c == 123 or c == 91:
        while i < n:
            c = p[i]
            if c == 34:
                i = _skip_string(p, i, n)
                if i < 0:
                    return -1
                continue
            if c == 123 or c == 91:
                depth += 1
            elif c == 125 or c == 93:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return -1
    while i < n and p[i] != 44 and p[i] != 125 and p[i] != 93:
        i += 1
    return i


cdef Py_ssize_t _scan(const char* p, Py_ssize_t n, Py_ssize_t* ko, Py_ssize_t* kn, Py_ssize_t* vo,
                      Py_ssize_t* vn) noexcept nogil:
    """The top-level entries of the JSON object ``p[0:n]`` (key and value offsets and lengths), or -1
    when it is not an object of unescaped keys in strictly increasing byte order (then the Python path
    reads it)."""
    cdef Py_ssize_t i = 1, m = 0, j, e, cmp_n
    cdef int c
    cdef const char* q
    if n < 2 or p[0] != 123 or p[n - 1] != 125:
        return -1
    if n == 2:
        return 0
    while True:
        if m >= _MAX_KEYS or i >= n or p[i] != 34:
            return -1
        q = <const char*>memchr(p + i + 1, 34, n - i - 1)
        if q == NULL:
            return -1
        j = q - p
        if memchr(p + i + 1, 92, j - i - 1) != NULL:  # an escaped key
            return -1
        if j + 1 >= n or p[j + 1] != 58:
            return -1
        ko[m] = i + 1
        kn[m] = j - i - 1
        if m > 0:  # strictly after the previous key (no repeats: each key is one value)
            cmp_n = kn[m] if kn[m] < kn[m - 1] else kn[m - 1]
            c = memcmp(p + ko[m - 1], p + ko[m], cmp_n)
            if c > 0 or (c == 0 and kn[m - 1] >= kn[m]):
                return -1
        e = _skip_value(p, j + 2, n)
        if e < 0:
            return -1
        vo[m] = j + 2
        vn[m] = e - j - 2
        m += 1
        if e == n - 1:
            return m
        if e >= n or p[e] != 44:
            return -1
        i = e + 1


cdef inline bint _is(const char* p, Py_ssize_t n, const char* lit, Py_ssize_t ln) noexcept nogil:
    return n == ln and memcmp(p, lit, ln) == 0


cdef inline void _put(at_hw* w, const char* s, Py_ssize_t n) noexcept nogil:
    at_hw_put(w, <const void*>s, <size_t>n)


cdef int _digits(int64_t v, char* buf) noexcept nogil:
    """``v`` in decimal at the end of the 24-byte ``buf``; returns where it starts."""
    cdef int i = 24
    cdef unsigned long long u
    cdef bint neg = v < 0
    u = <unsigned long long>(-(v + 1)) + 1 if neg else <unsigned long long>v
    while True:
        i -= 1
        buf[i] = <char>(48 + u % 10)
        u //= 10
        if u == 0:
            break
    if neg:
        i -= 1
        buf[i] = 45
    return i


cdef void _put_int(at_hw* w, int64_t v) noexcept nogil:
    cdef char buf[24]
    cdef int i = _digits(v, buf)
    at_hw_put(w, buf + i, 24 - i)


cdef bint _int64(object v, int64_t* out):
    """An int column value (None counts as 0, as ``x or 0`` reads it); False for another type or size."""
    cdef int overflow = 0
    if v is None:
        out[0] = 0
        return True
    if type(v) is not int:
        return False
    out[0] = <int64_t>PyLong_AsLongLongAndOverflow(v, &overflow)
    return overflow == 0


cdef bint _same_int_value(const char* p, Py_ssize_t n, int64_t v):
    """Is ``p[0:n]`` the typed int ``{"i":"<v>"}`` as the store writes it?"""
    cdef char buf[24]
    cdef int i = _digits(v, buf)
    return (n == 24 - i + 8 and memcmp(p, b'{"i":"', 6) == 0 and memcmp(p + 6, buf + i, 24 - i) == 0
            and p[n - 2] == 34 and p[n - 1] == 125)


cdef bint _same_text_value(const char* p, Py_ssize_t n, object s, char tag):
    """Is ``p[0:n]`` the typed value ``{"<tag>":"<s escaped>"}`` (as the store writes a text or an
    int)? ``s`` is a str; a value with a character to escape is left to the Python path."""
    cdef Text t
    cdef Py_ssize_t i
    if not _utf8(s, &t):
        return False
    if n != t.n + 8 or p[0] != 123 or p[1] != 34 or p[2] != tag or p[3] != 34 or p[4] != 58 or p[5] != 34:
        return False
    if p[n - 2] != 34 or p[n - 1] != 125:
        return False
    for i in range(t.n):
        if <unsigned char>t.p[i] < 32 or t.p[i] == 34 or t.p[i] == 92:
            return False
    return memcmp(p + 6, t.p, t.n) == 0


cdef bint _label_at(const char* k, Py_ssize_t kn, Py_ssize_t* ev, Py_ssize_t* ko, Py_ssize_t* klen) noexcept nogil:
    """``split_label``: an ``event:N:key`` label names event N's key (N in canonical decimal), any other
    names the span's own key; False for an index of more than 9 digits."""
    cdef Py_ssize_t i = 6, v = 0
    ev[0] = -1
    ko[0] = 0
    klen[0] = kn
    if kn < 8 or memcmp(k, b"event:", 6) != 0:
        return True
    if not (48 <= k[6] <= 57):
        return True
    while i < kn and 48 <= k[i] <= 57:
        if i - 6 >= 9:
            return False  # an event index past any span's events: the Python path refuses it
        v = v * 10 + (k[i] - 48)
        i += 1
    if i >= kn or k[i] != 58 or (k[6] == 48 and i > 7):
        return True
    ev[0] = v
    ko[0] = i + 1
    klen[0] = kn - i - 1
    return True


cdef signed char _UNHEX[256]
for _c in range(256):
    _UNHEX[_c] = -1
for _c in range(10):
    _UNHEX[48 + _c] = _c
for _c in range(6):
    _UNHEX[97 + _c] = 10 + _c  # lower case only: the reference refuses any other salt


cdef struct Salt:
    Py_ssize_t ev          # event index, -1 for the span's own attributes
    const char* key
    Py_ssize_t key_n
    unsigned char salt[16]
    bint used


cdef Py_ssize_t _salts(const char* p, Py_ssize_t n, Salt* out) noexcept nogil:
    """The salts of the stored value ``{"s":"{\\"label\\":\\"hex\\",...}"}`` as ``salts_text`` writes it
    (no other escapes in it), or -1 (then the Python path reads it)."""
    cdef Py_ssize_t i, j, m = 0, k, ev, ko, kl
    cdef int hi, lo
    if n < 10 or memcmp(p, b'{"s":"{', 7) != 0 or memcmp(p + n - 3, b'}"}', 3) != 0:
        return -1
    i = 7
    if i == n - 3:
        return 0
    while True:
        if m >= _MAX_SALTS or i + 2 > n or p[i] != 92 or p[i + 1] != 34:
            return -1
        j = i + 2
        while j < n and p[j] != 92 and p[j] != 34:
            j += 1
        # \"label\":\"<32 hex>\"
        if j + 40 > n or memcmp(p + j, b'\\":\\"', 5) != 0 or p[j + 37] != 92 or p[j + 38] != 34:
            return -1
        if not _label_at(p + i + 2, j - i - 2, &ev, &ko, &kl):
            return -1
        out[m].ev = ev
        out[m].key = p + i + 2 + ko
        out[m].key_n = kl
        out[m].used = False
        for k in range(16):
            hi = _UNHEX[<unsigned char>p[j + 5 + 2 * k]]
            lo = _UNHEX[<unsigned char>p[j + 6 + 2 * k]]
            if hi < 0 or lo < 0:
                return -1
            out[m].salt[k] = <unsigned char>(hi * 16 + lo)
        for k in range(m):
            if out[k].ev == ev and out[k].key_n == kl and memcmp(out[k].key, out[m].key, kl) == 0:
                return -1  # a repeated label: the Python path reads it
        m += 1
        i = j + 39
        if p[i] == 125 and i == n - 3:
            return m
        if p[i] != 44:
            return -1
        i += 1


cdef void _commitment(at_hw* w, const unsigned char* salt, const char* v, Py_ssize_t vn) noexcept nogil:
    """``{"c":"<hex sha256(salt || value bytes)>"}`` into the leaf."""
    cdef unsigned char dig[32]
    cdef at_sha_ctx h
    cdef char out[72]
    at_ctx_init(&h)
    at_ctx_update(&h, salt, 16)
    at_ctx_update(&h, v, vn)
    at_ctx_final(&h, dig)
    out[0] = 123; out[1] = 34; out[2] = 99; out[3] = 34; out[4] = 58; out[5] = 34  # {"c":"
    _hex32(out + 6, dig)
    out[70] = 34; out[71] = 125  # "}
    at_hw_put(w, out, 72)


cdef bint _attributes(at_hw* w, const char* p, Py_ssize_t n, const char* drop_kinds, Py_ssize_t m,
                      Py_ssize_t* ko, Py_ssize_t* kn, Py_ssize_t* vo, Py_ssize_t* vn, Salt* salts,
                      Py_ssize_t ns, Py_ssize_t ev) noexcept nogil:
    """The attribute set's entries into the leaf, less the dropped ones, each salted value (its salt
    in ``salts`` for event ``ev``) as its commitment; False when a salt names no key of the set."""
    cdef Py_ssize_t k, s
    cdef bint first = True
    cdef char kind
    _put(w, "{", 1)
    for k in range(m):
        kind = drop_kinds[k] if drop_kinds != NULL else _KEEP
        if kind == _DROP:
            continue
        if not first:
            _put(w, ",", 1)
        first = False
        _put(w, p + ko[k] - 1, kn[k] + 3)  # "key":
        for s in range(ns):
            if salts[s].ev == ev and salts[s].key_n == kn[k] and memcmp(salts[s].key, p + ko[k], kn[k]) == 0:
                salts[s].used = True
                _commitment(w, salts[s].salt, p + vo[k], vn[k])
                break
        else:
            _put(w, p + vo[k], vn[k])
    _put(w, "}", 1)
    return True


cdef object _EMPTY = ""


cdef bint _event(at_hw* w, dict e, Py_ssize_t idx, Salt* salts, Py_ssize_t ns, Py_ssize_t* ko,
                 Py_ssize_t* kn, Py_ssize_t* vo, Py_ssize_t* vn) except -1:
    """One stored event as ``_fast_events`` makes it; False for a form left to the Python path."""
    cdef Text t, nm
    cdef int64_t dropped = 0, tm = 0
    cdef Py_ssize_t m
    text = e.get("attributes")
    if text is None or text == _EMPTY:
        text = "{}"
    if not _utf8(text, &t) or not _utf8(e.get("name"), &nm):
        return False
    if not _int64(e.get("dropped_attributes_count"), &dropped) or not _int64(e.get("time_unix_nano"), &tm):
        return False
    if e.get("time_unix_nano") is None:
        return False
    m = _scan(t.p, t.n, ko, kn, vo, vn)
    if m < 0:
        return False
    _put(w, '{"attributes":', 14)
    _attributes(w, t.p, t.n, NULL, m, ko, kn, vo, vn, salts, ns, idx)
    _put(w, ',"dropped_attributes_count":', 28)
    _put_int(w, dropped)
    _put(w, ',"name":"', 9)
    at_hw_escaped(w, <const unsigned char*>nm.p, nm.n)
    _put(w, '","time_unix_nano":"', 20)
    _put_int(w, tm)
    _put(w, '"}', 2)
    return True


cdef bint _text_field(at_hw* w, const char* key, Py_ssize_t kn, object v, bint none_empty):
    """``,"key":"escaped v"``; ``none_empty``: None as the empty text, as ``x or ""`` reads it (else
    None is the Python path's: its leaf holds a null there)."""
    cdef Text t
    if v is None and none_empty:
        t.p = ""
        t.n = 0
    elif not _utf8(v, &t):
        return False
    _put(w, key, kn)
    at_hw_escaped(w, <const unsigned char*>t.p, t.n)
    _put(w, '"', 1)
    return True


cdef object _row(const char* ap, Py_ssize_t an, object evs, object tid, object sid, object parent, object ts, object name,
                 object kind, object start, object end, object sc, object sm, object da, object de, object dl,
                 object c_id, object c_seq, object c_prev, object c_hash, object c_ep,
                 Py_ssize_t* ko, Py_ssize_t* kn, Py_ssize_t* vo, Py_ssize_t* vn, char* kinds, Salt* salts):
    """The Merkle leaf hash of one row when its streamed leaf links to ``c_hash``, else None."""
    cdef Text a, prev
    cdef Py_ssize_t m, k, ns = 0, i
    a.p = ap
    a.n = an
    cdef int64_t i_da = 0, i_de = 0, i_dl = 0, i_kind = 0, i_start = 0, i_end = 0, i_sc = 0, i_seq = 0, i_ep = 0
    cdef bint seen_id = False, seen_seq = False, seen_prev = False, seen_hash = False, seen_ep = False
    cdef bint salted = False, ok
    cdef const char* kp
    cdef Py_ssize_t kl
    cdef at_hw w
    cdef unsigned char lh[32]
    cdef unsigned char dig[32]
    cdef char hexed[64]
    if not (_int64(da, &i_da) and _int64(de, &i_de) and _int64(dl, &i_dl) and _int64(sc, &i_sc)):
        return None
    if kind is None or start is None or end is None or c_seq is None:
        return None
    if not (_int64(kind, &i_kind) and _int64(start, &i_start) and _int64(end, &i_end) and _int64(c_seq, &i_seq)
            and _int64(c_ep, &i_ep)):
        return None
    if type(c_id) is not str or type(c_hash) is not str or type(c_prev) is not str or not PyUnicode_IS_ASCII(c_prev):
        return None  # a prev that is not hex text: the Python path says what is wrong with it
    prev.p = <const char*>PyUnicode_DATA(c_prev)
    prev.n = PyUnicode_GET_LENGTH(c_prev)
    m = _scan(a.p, a.n, ko, kn, vo, vn)
    if m < 0:
        return None
    for k in range(m):  # the agenttape.chain.* values: checked against the columns, left out of the leaf
        kinds[k] = _KEEP
        kp = a.p + ko[k]
        kl = kn[k]
        if kl < 16 or memcmp(kp, b"agenttape.chain.", 16) != 0:
            continue
        kp += 16
        kl -= 16
        if _is(kp, kl, "id", 2):
            ok = seen_id = _same_text_value(a.p + vo[k], vn[k], c_id, 115)
        elif _is(kp, kl, "seq", 3):
            ok = seen_seq = _same_int_value(a.p + vo[k], vn[k], i_seq)
        elif _is(kp, kl, "prev", 4):
            ok = seen_prev = _same_text_value(a.p + vo[k], vn[k], c_prev, 115)
        elif _is(kp, kl, "hash", 4):
            ok = seen_hash = _same_text_value(a.p + vo[k], vn[k], c_hash, 115)
        elif _is(kp, kl, "epoch", 5):
            ok = seen_ep = _same_int_value(a.p + vo[k], vn[k], i_ep)
        elif _is(kp, kl, "salts", 5):
            ns = _salts(a.p + vo[k], vn[k], salts)
            ok = salted = ns >= 0
        else:  # agenttape.chain.erased: erased values are entered as commitments, the Python path's work
            ok = not _is(kp, kl, "erased", 6)
            if ok:
                continue  # another agenttape.chain.* key: part of the leaf
        if not ok:
            return None
        kinds[k] = _DROP
    if not (seen_id and seen_seq and seen_prev and seen_hash) or (not seen_ep and i_ep != 0):
        return None
    for i in range(ns):  # a salt for an event the row does not have: the Python path decides
        if salts[i].ev >= 0 and (evs is None or salts[i].ev >= len(<list>evs)):
            return None
    at_hw_init(&w)
    _put(&w, "\x00", 1)
    _put(&w, '{"attributes":', 14)
    # the span's attributes are written from their own scan; events reuse the arrays after it
    _attributes(&w, a.p, a.n, kinds, m, ko, kn, vo, vn, salts, ns, -1)
    _put(&w, ',"dropped_attributes_count":', 28)
    _put_int(&w, i_da)
    _put(&w, ',"dropped_events_count":', 24)
    _put_int(&w, i_de)
    _put(&w, ',"dropped_links_count":', 23)
    _put_int(&w, i_dl)
    _put(&w, ',"end_time_unix_nano":"', 23)
    _put_int(&w, i_end)
    _put(&w, '","events":[', 12)
    if evs is not None:
        i = 0
        last = -1
        for e in <list>evs:
            if type(e) is not dict:
                return None
            idx = (<dict>e).get("event_index")
            if type(idx) is not int or idx != i:  # stored in order, 0, 1, ...: else the Python path sorts
                return None
            if i:
                _put(&w, ",", 1)
            if not _event(&w, <dict>e, i, salts, ns, ko, kn, vo, vn):
                return None
            i += 1
    _put(&w, '],"kind":', 9)
    _put_int(&w, i_kind)
    _put(&w, ',"links":[]', 11)
    if not _text_field(&w, ',"name":"', 9, name, False):
        return None
    if not _text_field(&w, ',"parent_span_id":"', 19, parent, True):
        return None
    if not _text_field(&w, ',"span_id":"', 12, sid, False):
        return None
    _put(&w, ',"start_time_unix_nano":"', 25)
    _put_int(&w, i_start)
    _put(&w, '","status":{"code":', 19)
    _put_int(&w, i_sc)
    if not _text_field(&w, ',"message":"', 12, sm, True):
        return None
    _put(&w, "}", 1)
    if not _text_field(&w, ',"trace_id":"', 13, tid, False):
        return None
    if not _text_field(&w, ',"trace_state":"', 16, ts, True):
        return None
    _put(&w, ',"v":2}' if salted else ',"v":1}', 7)
    for i in range(ns):
        if not salts[i].used:  # a salt kept for a value that is gone: the Python path decides
            return None
    at_hw_final(&w, lh)
    # the link: sha256(prev || "|" || hex(leaf hash)), compared with the stored chain hash
    _hex32(hexed, lh)
    at_hw_init(&w)
    _put(&w, prev.p, prev.n)
    _put(&w, "|", 1)
    _put(&w, hexed, 64)
    at_hw_final(&w, dig)
    if PyUnicode_GET_LENGTH(c_hash) != 64 or not PyUnicode_IS_ASCII(c_hash):
        return None
    kp = <const char*>PyUnicode_DATA(c_hash)
    _hex32(hexed, dig)  # (the leaf's hex is no longer needed)
    if memcmp(kp, hexed, 64) != 0:
        return None
    return PyBytes_FromStringAndSize(<char*>lh, 32)


def available() -> bool:
    """Whether rows can be hashed here (SHA-256 called directly; else the Python path runs)."""
    return bool(_DIRECT)


def batch(dict col, Py_ssize_t n, object ev_by, object lk_by, object attributes=None) -> tuple:
    """``(entries, left)``: for each of the ``n`` rows of the columns ``col`` (as ``batch_entries`` reads
    them), its compact entry when its streamed leaf links to its stored chain hash, else None (the
    Python path's row), and how many were left. ``attributes``: that column as an Arrow string array,
    read in place (else ``col["attributes"]``, a list of str)."""
    cdef Py_ssize_t ko[_MAX_KEYS]
    cdef Py_ssize_t kn[_MAX_KEYS]
    cdef Py_ssize_t vo[_MAX_KEYS]
    cdef Py_ssize_t vn[_MAX_KEYS]
    cdef char kinds[_MAX_KEYS]
    cdef Salt salts[_MAX_SALTS]
    cdef Py_ssize_t i, j, left = n
    cdef Text t
    cdef const int32_t* off32 = NULL
    cdef const int64_t* off64 = NULL
    cdef const char* data = b""
    cdef const unsigned char* valid = NULL
    cdef Py_ssize_t base = 0
    cdef int64_t a0, a1
    cdef list out = [None] * n
    cdef list texts = None
    if not _DIRECT:
        return out, left
    if attributes is not None:  # the Arrow array's own buffers: validity, offsets, UTF-8 data
        kind = str(attributes.type)
        if kind not in ("string", "large_string") or len(attributes) < n:
            return out, left
        bufs = attributes.buffers()  # (held while the loop reads them)
        if bufs[0] is not None:
            valid = <const unsigned char*><uintptr_t>bufs[0].address
        if kind == "string":
            off32 = <const int32_t*><uintptr_t>bufs[1].address
        else:
            off64 = <const int64_t*><uintptr_t>bufs[1].address
        if bufs[2] is not None:
            data = <const char*><uintptr_t>bufs[2].address
        base = attributes.offset
    else:
        texts = col["attributes"]
        if len(texts) < n:
            return out, left
    cdef list none = [None] * n
    get = col.get
    cdef list tids = col["trace_id"], sids = col["span_id"], names = col["name"]
    cdef list parents = get("parent_span_id", none), tss = get("trace_state", none)
    cdef list kinds_c = col["kind"], starts = col["start_time_unix_nano"], ends = col["end_time_unix_nano"]
    cdef list scs = get("status_code", none), sms = get("status_message", none)
    cdef list das = get("dropped_attributes_count", none), des = get("dropped_events_count", none)
    cdef list dls = get("dropped_links_count", none), cids = get("chain_id", none), seqs = get("chain_seq", none)
    cdef list prevs = get("chain_prev", none), hashes = get("chain_hash", none), eps = get("chain_epoch", none)
    for lst in (tids, sids, names, parents, tss, kinds_c, starts, ends, scs, sms, das, des, dls, cids, seqs,
                prevs, hashes, eps):
        if len(<list>lst) < n:
            return out, left
    interned = {}
    for i in range(n):
        if texts is not None:
            if not _utf8(texts[i], &t):
                continue
        else:
            j = base + i
            if valid != NULL and not (valid[j >> 3] >> (j & 7)) & 1:
                continue
            if off32 != NULL:
                a0, a1 = off32[j], off32[j + 1]
            else:
                a0, a1 = off64[j], off64[j + 1]
            t.p = data + a0
            t.n = a1 - a0
        tid = tids[i]
        sid = sids[i]
        key = (tid, sid)
        if lk_by and key in lk_by:
            continue
        evs = ev_by.get(key) if ev_by else None
        if evs is not None and type(evs) is not list:
            continue
        lh = _row(t.p, t.n, evs, tid, sid, parents[i], tss[i], names[i], kinds_c[i], starts[i], ends[i],
                  scs[i], sms[i], das[i], des[i], dls[i], cids[i], seqs[i], prevs[i], hashes[i], eps[i],
                  ko, kn, vo, vn, kinds, salts)
        if lh is None:
            continue
        cid = cids[i]
        cid = interned.setdefault(cid, cid)
        h = hashes[i]
        out[i] = (cid, eps[i] or 0, seqs[i], prevs[i], h, h, lh, sid, tid, None, None)
        left -= 1
    return out, left
