# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled rows of OTLP spans: ``rows.Conversion.add_span`` for a serialized span in protobuf's own layout.

Reading a parsed span from Python costs a call per field; here one pass over the span's bytes reads
every field, and the attribute and event caches of ``wirecache.py`` are consulted as ``rows.py`` does.
A span this walk does not take on exactly as protobuf would read it goes, as bytes, to the Python
path (``fallback``): a repeated ``status``, a group, a known field with another wire type, a field
that runs past the end, text that is not strict UTF-8, links, ids the receiver rejects, a span seen
before in this conversion. The rows are the same either way; ``tests/test_spanwalk.py`` holds them
equal, adversarial layouts included.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.ref cimport Py_INCREF
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, uint32_t, uint64_t

cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object o)

cdef const char* _HEX = b"0123456789abcdef"
DEF _MAX = 512  # attributes or events per span handled here (the SDK's default limit is 128)
cdef uint64_t _NS_PER_DAY = 86400000000000


cdef inline void _set(tuple t, Py_ssize_t i, object value):
    """``t[i] = value`` in a tuple being built (PyTuple_SET_ITEM takes the reference over)."""
    Py_INCREF(value)
    PyTuple_SET_ITEM(t, i, value)


cdef object _hex(const unsigned char* p, Py_ssize_t n):
    cdef object out = PyUnicode_New(2 * n, 127)
    cdef char* d = <char*>PyUnicode_DATA(out)
    cdef Py_ssize_t i
    for i in range(n):
        d[2 * i] = _HEX[p[i] >> 4]
        d[2 * i + 1] = _HEX[p[i] & 15]
    return out


cdef inline Py_ssize_t _varint(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end, uint64_t* out) noexcept:
    """The position after the varint at ``pos`` (its value in ``out``), or -1: past the end, or more
    than 10 bytes, or a 10th byte above 1 (left to protobuf)."""
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef unsigned char b
    while pos < end:
        b = p[pos]
        pos += 1
        if shift == 63 and b > 1:
            return -1
        value |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = value
            return pos
        shift += 7
        if shift > 63:
            return -1
    return -1


cdef inline Py_ssize_t _tag(const unsigned char* p, Py_ssize_t pos, Py_ssize_t end, uint32_t* field,
                            uint32_t* wire) noexcept:
    """The position after the field tag at ``pos`` (its number and wire type out), or -1 for a tag
    protobuf rejects (field 0, past 32 bits) or one that runs past ``end``."""
    cdef uint64_t tag
    pos = _varint(p, pos, end, &tag)
    if pos < 0 or tag > 0xFFFFFFFF or (tag >> 3) == 0:
        return -1
    field[0] = <uint32_t>(tag >> 3)
    wire[0] = <uint32_t>(tag & 7)
    return pos


cdef inline object _text(const unsigned char* p, Py_ssize_t n):
    """Strict UTF-8 text, or None where protobuf's check decides (it raises)."""
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        return None


cdef bint _string_kv(const unsigned char* p, Py_ssize_t n, Py_ssize_t* value_at) noexcept:
    """Whether a KeyValue is laid out as protobuf writes one with a non-empty string value
    (``wirecache.string_kv``): the key at 2 (its length at 1), the value from ``value_at`` to the end."""
    cdef Py_ssize_t pos
    cdef uint64_t length
    cdef int tag_i
    cdef unsigned char tags[2]
    if n < 7 or p[0] != 0x0A or p[1] >= 0x80:
        return False
    pos = 2 + p[1]
    tags[0] = 0x12
    tags[1] = 0x0A
    for tag_i in range(2):
        if pos >= n or p[pos] != tags[tag_i]:
            return False
        pos = _varint(p, pos + 1, n, &length)
        if pos < 0 or length != <uint64_t>(n - pos):
            return False
    if pos == n:
        return False
    value_at[0] = pos
    return True


cdef object _plain_entry(const unsigned char* p, Py_ssize_t n, Caches c):
    """``wirecache.kv_entry`` of a plain string KeyValue (without the caching), or None to leave it to ``kv_entry``.
    (The JSON string itself is left to orjson, whose escaping is faster than a loop over bytes.)"""
    cdef Py_ssize_t value_at
    if not _string_kv(p, n, &value_at):
        return None
    key = _text(p + 2, p[1])
    if key is None:
        return None
    value = _text(p + value_at, n - value_at)
    if value is None:
        return None
    return _piece(key, value, c)


cdef class Caches:
    """The caches and routines of ``wirecache.py`` that a walk shares (``wirecache.CACHES``, read once per
    conversion), and ``fallback(raw, rid, scope_name, scope_version, service)``: the Python path."""
    cdef dict kv_cache, plans, event_cache, prefixes, slots
    cdef set kv_seen, event_seen
    cdef object kv_entry, string_piece, make_plan, event_fields, admit_tail, fallback, no_promoted
    cdef object dumps, system
    cdef Py_ssize_t cached_kv_bytes, cached_event_bytes, provider, cache_entries, seen_entries

    def __init__(self, shared: object, fallback: object) -> None:
        self.kv_cache, self.kv_seen, self.kv_entry = shared.kv_cache, shared.kv_seen, shared.kv_entry
        self.string_piece, self.prefixes, self.slots = shared.string_piece, shared.prefixes, shared.slots
        self.plans, self.make_plan, self.no_promoted = shared.plans, shared.make_plan, shared.no_promoted
        self.event_cache, self.event_seen = shared.event_cache, shared.event_seen
        self.event_fields, self.admit_tail = shared.event_fields, shared.admit_tail
        self.cached_kv_bytes, self.cached_event_bytes = shared.cached_kv_bytes, shared.cached_event_bytes
        self.cache_entries, self.seen_entries = shared.cache_entries, shared.seen_entries
        self.provider, self.system, self.dumps = shared.provider, shared.system, shared.dumps
        self.fallback = fallback


cdef tuple _piece(object key, object value, Caches c):
    """``wirecache.string_piece``: (key, '"key":{"s":"value"}', promoted value); keys with a promoted
    column, or whose JSON prefix is not cached yet, go to it."""
    prefix = c.prefixes.get(key)
    if prefix is None or key in c.slots:
        return c.string_piece(key, value)
    piece = "".join((prefix, (<bytes>c.dumps(value)).decode(), "}"))
    return key, piece, (value if key == c.system else None)


cdef inline void _note(set seen, object h, Py_ssize_t limit) except *:
    """A first miss: only its hash is kept (``wirecache.admit``), in a set cleared when full."""
    if len(seen) >= limit:
        seen.clear()
    seen.add(h)


cdef inline void _admit(Caches c, object key, object value) except *:
    """``wirecache.admit`` for the KeyValue cache: cache on the second miss, note the hash on the first."""
    h = hash(key)
    if h in c.kv_seen:
        if len(c.kv_cache) >= c.cache_entries:
            c.kv_cache.clear()
        c.kv_cache[key] = value
    else:
        _note(c.kv_seen, h, c.seen_entries)


cdef tuple _attributes(const unsigned char* p, Py_ssize_t* at, Py_ssize_t* lens, Py_ssize_t m, Caches c):
    """(attributes JSON, the promoted values plus a None, the plan) of the KeyValues at ``at``/``lens``,
    as ``wirecache.attrs_json`` and ``rows.Conversion.add_span`` make them."""
    cdef Py_ssize_t i, k, n
    cdef tuple keys_t = PyTuple_New(m)
    cdef tuple pieces_t = PyTuple_New(m)
    cdef tuple values_t = PyTuple_New(m + 1)
    _set(values_t, m, None)
    for i in range(m):
        k = at[i]
        n = lens[i]
        if n <= c.cached_kv_bytes:
            kv = PyBytes_FromStringAndSize(<const char*>(p + k), n)
            entry = c.kv_cache.get(kv)
            if entry is None:
                entry = _plain_entry(p + k, n, c)
                if entry is None:
                    entry = c.kv_entry(kv)  # (which notes or caches it itself)
                else:
                    _admit(c, kv, entry)
        else:
            # too long to be cached: read it here when it is a plain string
            entry = _plain_entry(p + k, n, c)
            if entry is None:
                entry = c.kv_entry(PyBytes_FromStringAndSize(<const char*>(p + k), n))
        _set(keys_t, i, (<tuple>entry)[0])
        _set(pieces_t, i, (<tuple>entry)[1])
        _set(values_t, i, (<tuple>entry)[2])
    plan = c.plans.get(keys_t)
    if plan is None:
        plan = c.make_plan(keys_t)
    return "{" + ",".join((<tuple>plan)[0](pieces_t)) + "}", values_t, plan


cdef object _status(const unsigned char* p, Py_ssize_t n, int32_t* code):
    """The message of a serialized ``Status`` (its code in ``code``), or None for anything protobuf
    would read differently. Fields: message (2, string), code (3, int32); unknown ones are skipped."""
    cdef Py_ssize_t pos = 0
    cdef uint64_t v
    cdef uint32_t field, wire
    cdef object message = ""
    while pos < n:
        pos = _tag(p, pos, n, &field, &wire)
        if pos < 0:
            return None
        if wire == 2:
            pos = _varint(p, pos, n, &v)
            if pos < 0 or v > <uint64_t>(n - pos) or field == 3:
                return None
            if field == 2:
                message = _text(p + pos, <Py_ssize_t>v) if v else ""
                if message is None:
                    return None
            pos += <Py_ssize_t>v
        elif wire == 0:
            pos = _varint(p, pos, n, &v)
            if pos < 0 or field == 2:
                return None
            if field == 3:
                code[0] = <int32_t><uint32_t>v
        elif wire == 1 and n - pos >= 8 and field > 3:
            pos += 8
        elif wire == 5 and n - pos >= 4 and field > 3:
            pos += 4
        else:
            return None
    return message


cdef tuple _event(const unsigned char* p, Py_ssize_t n, Caches c):
    """(time, name, attributes JSON, dropped count) of a serialized event, as ``wirecache.event_fields``
    reads it; None for anything protobuf would read differently (those go to ``_event_fields``)."""
    cdef Py_ssize_t pos = 0, k, m = 0
    cdef uint64_t v, time = 0
    cdef uint32_t field, wire, dropped = 0
    cdef Py_ssize_t at[_MAX]
    cdef Py_ssize_t lens[_MAX]
    cdef object name = ""
    while pos < n:
        pos = _tag(p, pos, n, &field, &wire)
        if pos < 0:
            return None
        if wire == 2:
            pos = _varint(p, pos, n, &v)
            if pos < 0 or v > <uint64_t>(n - pos):
                return None
            k = pos
            pos += <Py_ssize_t>v
            if field == 2:
                name = _text(p + k, <Py_ssize_t>v) if v else ""
                if name is None:
                    return None
            elif field == 3:
                if m == _MAX:
                    return None
                at[m] = k
                lens[m] = <Py_ssize_t>v
                m += 1
            elif field <= 4:
                return None
        elif wire == 0:
            pos = _varint(p, pos, n, &v)
            if pos < 0:
                return None
            if field == 4:
                dropped = <uint32_t>v
            elif field <= 4:
                return None
        elif wire == 1:
            if n - pos < 8:
                return None
            if field == 1:
                time = _le64(p + pos)
            elif field <= 4:
                return None
            pos += 8
        elif wire == 5:
            if n - pos < 4 or field <= 4:
                return None
            pos += 4
        else:
            return None
    attributes = _attributes(p, at, lens, m, c)[0] if m else "{}"
    return time, name, attributes, dropped


def walk(list raws, object conv, tuple where, Caches c):
    """Rows of serialized spans (one ``ScopeSpans``' worth) into ``conv`` (a ``rows.Conversion``);
    ``where`` is (resource id, scope name, scope version, service name)."""
    cdef object fallback = c.fallback
    cdef dict event_cache = c.event_cache
    cdef set seen = conv.seen
    cdef list span_rows = conv.span_rows
    cdef list event_rows = conv.event_rows
    cdef bint check_ids = conv.problems is not None
    cdef object rid, scope_name, scope_version, service
    rid, scope_name, scope_version, service = where

    cdef bytes raw
    cdef const unsigned char* p
    cdef Py_ssize_t n, pos, fend, k, m, i
    cdef uint64_t v, start, end
    cdef uint32_t field, wire
    cdef Py_ssize_t tid_at, tid_len, sid_at, sid_len, par_at, par_len, st_at, st_len
    cdef object trace_state, name, status_message, start_o, end_o
    cdef int32_t kind, code
    cdef uint32_t flags, d_attrs, d_events, d_links
    cdef bint ok, seen_status
    # where each attribute and event of the span lies in its bytes (more than _MAX: the Python path)
    cdef Py_ssize_t attr_at[_MAX]
    cdef Py_ssize_t attr_len[_MAX]
    cdef Py_ssize_t ev_at[_MAX]
    cdef Py_ssize_t ev_len[_MAX]
    cdef Py_ssize_t n_attrs, n_events
    cdef tuple row, values_t, promoted_t
    cdef object last_tid_key = None
    cdef object tid = None

    for raw in raws:
        p = <const unsigned char*>raw
        n = len(raw)
        tid_at = sid_at = par_at = 0
        tid_len = sid_len = par_len = 0
        trace_state = name = status_message = ""
        kind = code = 0
        flags = d_attrs = d_events = d_links = 0
        start = end = 0
        seen_status = False
        n_attrs = n_events = 0
        ok = True
        pos = 0
        while pos < n:
            pos = _tag(p, pos, n, &field, &wire)
            if pos < 0:
                ok = False
                break
            if wire == 2:
                pos = _varint(p, pos, n, &v)
                if pos < 0 or v > <uint64_t>(n - pos):
                    ok = False
                    break
                k = pos
                m = <Py_ssize_t>v
                pos += m
                if field == 1:
                    tid_at, tid_len = k, m
                elif field == 2:
                    sid_at, sid_len = k, m
                elif field == 3:  # text is checked at each occurrence, as protobuf checks it
                    trace_state = _text(p + k, m) if m else ""
                    if trace_state is None:
                        ok = False
                        break
                elif field == 4:
                    par_at, par_len = k, m
                elif field == 5:
                    name = _text(p + k, m) if m else ""
                    if name is None:
                        ok = False
                        break
                elif field == 9:
                    if n_attrs == _MAX:
                        ok = False
                        break
                    attr_at[n_attrs] = k
                    attr_len[n_attrs] = m
                    n_attrs += 1
                elif field == 11:
                    if n_events == _MAX:
                        ok = False
                        break
                    ev_at[n_events] = k
                    ev_len[n_events] = m
                    n_events += 1
                elif field == 15:
                    if seen_status:  # a second status merges into the first: protobuf's to do
                        ok = False
                        break
                    seen_status = True
                    st_at, st_len = k, m
                elif field == 13 or field <= 16:  # links (rare), or a known field with another wire type
                    ok = False
                    break
            elif wire == 0:
                pos = _varint(p, pos, n, &v)
                if pos < 0:
                    ok = False
                    break
                if field == 6:
                    kind = <int32_t><uint32_t>v
                elif field == 10:
                    d_attrs = <uint32_t>v
                elif field == 12:
                    d_events = <uint32_t>v
                elif field == 14:
                    d_links = <uint32_t>v
                elif field <= 16:
                    ok = False
                    break
            elif wire == 1:
                if n - pos < 8:
                    ok = False
                    break
                v = _le64(p + pos)
                pos += 8
                if field == 7:
                    start = v
                elif field == 8:
                    end = v
                elif field <= 16:
                    ok = False
                    break
            elif wire == 5:
                if n - pos < 4:
                    ok = False
                    break
                v = _le32(p + pos)
                pos += 4
                if field == 16:
                    flags = <uint32_t>v
                elif field <= 16:
                    ok = False
                    break
            else:  # groups and invalid wire types
                ok = False
                break
        if ok and seen_status:
            status_message = _status(p + st_at, st_len, &code)
            if status_message is None:
                ok = False
        if ok and check_ids and (
            tid_len != 16 or sid_len != 8 or (par_len != 0 and par_len != 8)
            or _zeros(p + tid_at, tid_len) or _zeros(p + sid_at, sid_len) or kind < -128 or kind > 127
        ):
            ok = False  # the Python path counts the problem (ids, or a kind past the TINYINT column)
        if ok:
            key = PyBytes_FromStringAndSize(<const char*>(p + tid_at), tid_len) + \
                PyBytes_FromStringAndSize(<const char*>(p + sid_at), sid_len)
            if key in seen:
                ok = False  # the Python path counts the repeat
        if not ok:
            fallback(raw, rid, scope_name, scope_version, service)
            continue
        seen.add(key)
        if tid is None or last_tid_key != key[:tid_len]:
            last_tid_key = key[:tid_len]
            tid = _hex(p + tid_at, tid_len)
        sid = _hex(p + sid_at, sid_len)
        start_o = start
        end_o = end
        day = start // _NS_PER_DAY

        if n_attrs:
            attributes, values_t, plan = _attributes(p, attr_at, attr_len, n_attrs, c)
            if (<tuple>plan)[1] is None:
                promoted = c.no_promoted
            else:
                promoted = (<tuple>plan)[1](values_t)
                if (<tuple>plan)[2] is not None and promoted[c.provider] is None:
                    promoted = list(promoted)
                    promoted[c.provider] = values_t[(<tuple>plan)[2]]
        else:
            attributes = "{}"
            promoted = c.no_promoted
        promoted_t = tuple(promoted)
        row = PyTuple_New(21 + len(promoted_t))
        _set(row, 0, tid)
        _set(row, 1, sid)
        _set(row, 2, _hex(p + par_at, par_len) if par_len else None)
        _set(row, 3, trace_state or None)
        _set(row, 4, flags)
        _set(row, 5, name)
        _set(row, 6, kind)
        _set(row, 7, start_o)
        _set(row, 8, end_o)
        _set(row, 9, (end_o - start_o) / 1e6)
        _set(row, 10, code)
        _set(row, 11, status_message or None)
        _set(row, 12, attributes)
        _set(row, 13, d_attrs)
        _set(row, 14, d_events)
        _set(row, 15, d_links)
        _set(row, 16, rid)
        _set(row, 17, scope_name)
        _set(row, 18, scope_version)
        _set(row, 19, service)
        for i in range(len(promoted_t)):
            _set(row, 20 + i, promoted_t[i])
        _set(row, 20 + len(promoted_t), day)
        span_rows.append(row)
        m = n_events
        for i in range(m):
            k = ev_at[i]
            fend = ev_len[i]
            hit = tail = None
            if fend > 9 and p[k] == 0x09:
                tail = PyBytes_FromStringAndSize(<const char*>(p + k + 9), fend - 9)
                hit = event_cache.get(tail)
            if hit is not None:
                v = _le64(p + k + 1)
                event_rows.append((tid, sid, i, v) + hit + (day,))
                continue
            fields = _event(p + k, fend, c)
            if fields is None:
                fields = c.event_fields(PyBytes_FromStringAndSize(<const char*>(p + k), fend))
            elif tail is not None and fend <= c.cached_event_bytes:
                # ``wirecache.admit_tail``: a first miss only notes the tail's hash
                h = hash(tail)
                if h in c.event_seen:
                    c.admit_tail(tail, fields[1:])
                else:
                    _note(c.event_seen, h, c.seen_entries)
            event_rows.append((tid, sid, i) + fields + (day,))


cdef inline uint64_t _le32(const unsigned char* p) noexcept:
    return <uint64_t>p[0] | <uint64_t>p[1] << 8 | <uint64_t>p[2] << 16 | <uint64_t>p[3] << 24


cdef inline uint64_t _le64(const unsigned char* p) noexcept:
    cdef uint64_t v = 0
    cdef int i
    for i in range(7, -1, -1):
        v = v << 8 | p[i]
    return v


cdef inline bint _zeros(const unsigned char* p, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i]:
            return False
    return True


def columns(list rows, Py_ssize_t width):
    """The columns of ``rows`` as lists (``tables.table`` transposes with this instead of ``zip(*rows)``,
    which steps one iterator per row); None unless every row is a tuple of ``width`` items."""
    cdef Py_ssize_t n = len(rows), i, j
    cdef list out = []
    cdef list col
    cdef tuple row
    for i in range(n):
        if type(rows[i]) is not tuple or PyTuple_GET_SIZE(rows[i]) != width:
            return None
    for j in range(width):
        col = PyList_New(n)
        for i in range(n):
            row = <tuple>rows[i]
            item = row[j]
            Py_INCREF(item)
            PyList_SET_ITEM(col, i, item)
        out.append(col)
    return out
