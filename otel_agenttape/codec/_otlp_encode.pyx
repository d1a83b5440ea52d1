# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of ``codec.otlp_encode.encode_span``: one SDK span as ``Span`` protobuf bytes.

The reference module writes each field as a Python ``bytes`` piece and joins them; here the same
fields are written, in the same order, into one growing C buffer. Attribute values of the plain kinds
(``str``, ``bool``, ``int`` within int64, ``float``, ``bytes``, ``None``, and tuples, lists and dicts of
them) are written here; any other value (another type or a subclass, an int out of int64, text UTF-8
cannot hold, a key that is not ASCII text) and any span link are handed to the reference functions
that ``configure`` names, so whatever they write, log or skip is what this writes, logs or skips.
``tests/test_codec_otlp_encode.py`` encodes the same spans with both and with the SDK's encoder.

State: what ``configure`` sets (the span-kind numbers and the two reference functions), and the SDK
types whose fields ``codec/sdk_layout.py`` found to be what their properties return.

Reads of the OpenTelemetry SDK's own span internals: where that probe held, and a span's type keeps
``ReadableSpan``'s properties, the span's fields are read directly (``_context``, ``_attributes``'s
``_dict``, ``_events``'s deque, ...; an ended span's lists no longer change); any other span,
context, event or status is read through its properties.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM

from otel_agenttape.codec._sdk_span cimport context_fields
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object s)
    void* PyUnicode_DATA(object s)
    Py_ssize_t PyUnicode_GET_LENGTH(object s)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    double PyFloat_AS_DOUBLE(object o)

cdef object _MappingProxy = type(type.__dict__)
cdef dict _KIND = None
cdef object _attributes_ref = None  # otlp_encode._attributes(mapping, tag) -> list[bytes]
cdef object _link_ref = None  # otlp_encode._link(link) -> bytes


def configure(kinds: dict, attributes: object, link: object) -> None:
    """The span-kind numbers and the reference functions for what this leaves to them."""
    global _KIND, _attributes_ref, _link_ref
    _KIND = kinds
    _attributes_ref = attributes
    _link_ref = link


# --- the SDK's span fields ---------------------------------------------------------------------------

cdef object _Readable = None  # the SDK types whose properties a probe showed to return their fields
cdef object _SpanContext = None
cdef object _TraceState = None
cdef object _Event = None
cdef object _Status = None
cdef object _BoundedAttributes = None
cdef object _BoundedList = None
cdef tuple _FIELD_PROPERTIES = ("name", "get_span_context", "parent", "kind", "start_time", "end_time",
                                "attributes", "events", "links", "status")
cdef tuple _DROPPED = ("dropped_attributes", "dropped_events", "dropped_links")
cdef dict _MODES = {}  # span type -> 0: properties, 1: fields, 2: fields but the dropped counts' properties


def _probe_fields() -> None:
    """The SDK types whose fields a probe showed to be what their properties return
    (``codec/sdk_layout.py``); none when it showed otherwise."""
    global _Readable, _SpanContext, _TraceState, _Event, _Status, _BoundedAttributes, _BoundedList
    from otel_agenttape.codec.sdk_layout import LAYOUT

    if LAYOUT is not None:
        _Readable, _SpanContext, _TraceState, _Event = (LAYOUT.readable_span, LAYOUT.span_context,
                                                       LAYOUT.trace_state, LAYOUT.event)
        _Status, _BoundedAttributes, _BoundedList = LAYOUT.status, LAYOUT.bounded_attributes, LAYOUT.bounded_list


_probe_fields()


def reads_fields(span_type: type) -> bool:
    """Whether spans of ``span_type`` are read through their fields (else through their properties)."""
    return _mode(span_type) != 0


cdef int _mode(object tp) except -1:
    r = _MODES.get(tp)
    if r is None:
        if _Readable is None or not isinstance(tp, type) or not issubclass(tp, _Readable) or any(
                getattr(tp, n, None) is not getattr(_Readable, n) for n in _FIELD_PROPERTIES):
            r = 0
        elif all(getattr(tp, n, None) is getattr(_Readable, n) for n in _DROPPED):
            r = 1
        else:
            r = 2  # e.g. a copy that keeps its original's dropped counts
        if len(_MODES) < 64:
            _MODES[tp] = r
    return r


cdef inline object _items(object seq):
    """An ended span's events or links: a ``BoundedList``'s deque, a tuple or list as it is."""
    t = type(seq)
    if t is tuple or t is list:
        return seq
    if t is _BoundedList:
        return seq._dq
    return tuple(seq) if seq is not None else ()


cdef inline object _dropped(object holder, object bounded):
    return holder.dropped if isinstance(holder, bounded) else 0


cdef inline object _plain_attributes(object attrs):
    """What a span's or event's ``attributes`` property shows, as the dict behind it where there is one."""
    if attrs is None:
        return None
    if type(attrs) is _BoundedAttributes:
        return attrs._dict
    return attrs


cdef struct Buf:
    char* p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _grow(Buf* b, Py_ssize_t need) except -1:
    cdef Py_ssize_t cap = b.cap * 2 if b.cap else 4096
    cdef char* p
    while cap < b.n + need:
        cap *= 2
    p = <char*>realloc(b.p, cap)
    if p == NULL:
        raise MemoryError()
    b.p = p
    b.cap = cap
    return 0


cdef inline int _put(Buf* b, const char* s, Py_ssize_t n) except -1:
    if n <= 0:
        return 0
    if b.n + n > b.cap:
        _grow(b, n)
    memcpy(b.p + b.n, s, n)
    b.n += n
    return 0


cdef inline int _byte(Buf* b, unsigned char c) except -1:
    if b.n + 1 > b.cap:
        _grow(b, 1)
    b.p[b.n] = <char>c
    b.n += 1
    return 0


cdef inline Py_ssize_t _vsize(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 128:
        v >>= 7
        n += 1
    return n


cdef inline int _varint(Buf* b, uint64_t v) except -1:
    if b.n + 10 > b.cap:
        _grow(b, 10)
    while v >= 128:
        b.p[b.n] = <char>((v & 0x7F) | 0x80)
        b.n += 1
        v >>= 7
    b.p[b.n] = <char>v
    b.n += 1
    return 0


cdef inline int _fixed(Buf* b, uint64_t v, int width) except -1:
    """``v`` little-endian in ``width`` bytes (fixed64, fixed32, double)."""
    cdef int i
    if b.n + width > b.cap:
        _grow(b, width)
    for i in range(width):
        b.p[b.n + i] = <char>((v >> (8 * i)) & 0xFF)
    b.n += width
    return 0


cdef inline int _big_endian(Buf* b, object value, int width) except -1:
    """An id (an int of ``width`` bytes) big-endian, as ``int.to_bytes(width, "big")``."""
    data = value.to_bytes(width, "big")
    _put(b, PyBytes_AS_STRING(data), width)
    return 0


cdef inline int _text_field(Buf* b, unsigned char tag, object text) except -1:
    """``tag`` + length + the UTF-8 of ``text`` (a str; UnicodeEncodeError as ``str.encode`` raises it)."""
    cdef Py_ssize_t n
    if type(text) is str and PyUnicode_IS_COMPACT_ASCII(text):
        n = PyUnicode_GET_LENGTH(text)
        _byte(b, tag)
        _varint(b, n)
        _put(b, <const char*>PyUnicode_DATA(text), n)
        return 0
    data = text.encode("utf-8")
    n = PyBytes_GET_SIZE(data)
    _byte(b, tag)
    _varint(b, n)
    _put(b, PyBytes_AS_STRING(data), n)
    return 0


cdef int _pieces(Buf* b, object pieces) except -1:
    for piece in pieces:
        _put(b, PyBytes_AS_STRING(piece), PyBytes_GET_SIZE(piece))
    return 0


cdef int _any_value(Buf* out, object value) except -1:
    """An ``AnyValue`` body into ``out``, as ``otlp_encode._any_value`` writes it; 1 (and ``out`` left
    as it was) for a value this leaves to the reference: another type, an int out of int64, text that
    UTF-8 cannot hold."""
    cdef Py_ssize_t mark = out.n
    cdef Py_ssize_t pos = 0
    cdef PyObject* k
    cdef PyObject* v
    cdef Buf child
    cdef int overflow = 0
    cdef long long iv
    cdef double dv
    cdef uint64_t bits
    cls = type(value)
    if value is None:
        return 0
    if cls is str:
        try:
            _text_field(out, 0x0A, value)
        except UnicodeEncodeError:
            out.n = mark
            return 1
        return 0
    if cls is bool:
        _byte(out, 0x10)
        _byte(out, 1 if value else 0)
        return 0
    if cls is int:
        iv = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow:
            return 1
        _byte(out, 0x18)
        _varint(out, <uint64_t>iv)
        return 0
    if cls is float:
        dv = PyFloat_AS_DOUBLE(value)
        memcpy(&bits, &dv, 8)
        _byte(out, 0x21)
        _fixed(out, bits, 8)
        return 0
    if cls is bytes:
        _byte(out, 0x3A)
        _varint(out, PyBytes_GET_SIZE(value))
        _put(out, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
        return 0
    if cls is not list and cls is not tuple and cls is not dict:
        return 1
    child.p = NULL
    child.n = child.cap = 0
    try:
        if cls is dict:  # a kvlist: each entry a KeyValue
            while PyDict_Next(value, &pos, &k, &v):
                if type(<object>k) is not str or _key_value(&child, <object>k, <object>v):
                    out.n = mark
                    return 1
            _nested(out, 0x32, &child)
        else:  # an array: each item an AnyValue
            for item in value:
                if _nested_value(&child, 0x0A, item):
                    out.n = mark
                    return 1
            _nested(out, 0x2A, &child)
        return 0
    finally:
        free(child.p)


cdef int _nested_value(Buf* out, unsigned char tag, object value) except -1:
    """``tag`` + length + ``value``'s ``AnyValue``; 1 as ``_any_value``."""
    cdef Buf body
    body.p = NULL
    body.n = body.cap = 0
    try:
        if _any_value(&body, value):
            return 1
        _nested(out, tag, &body)
        return 0
    finally:
        free(body.p)


cdef int _key_value(Buf* out, object key, object value) except -1:
    """A ``KeyValue`` as a repeated field (tag 1) of a kvlist; 1 as ``_any_value``."""
    cdef Buf body
    body.p = NULL
    body.n = body.cap = 0
    try:
        if key:
            try:
                _text_field(&body, 0x0A, key)
            except UnicodeEncodeError:
                return 1
        if _nested_value(&body, 0x12, value):
            return 1
        _nested(out, 0x0A, &body)
        return 0
    finally:
        free(body.p)


cdef int _key_value_field(Buf* b, unsigned char tag, const char* kp, Py_ssize_t kn, const char* head,
                          Py_ssize_t hn, const char* data, Py_ssize_t dn) except -1:
    """A ``KeyValue`` as a field under ``tag``: key ``kp`` (none when empty), value ``head`` + ``data``."""
    cdef Py_ssize_t av_len = hn + dn
    _byte(b, tag)
    _varint(b, (1 + _vsize(kn) + kn if kn else 0) + 1 + _vsize(av_len) + av_len)
    if kn:
        _byte(b, 0x0A)
        _varint(b, kn)
        _put(b, kp, kn)
    _byte(b, 0x12)
    _varint(b, av_len)
    _put(b, head, hn)
    _put(b, data, dn)
    return 0


cdef int _attribute(Buf* b, unsigned char tag, object key, object value) except -1:
    """One attribute as a repeated ``KeyValue`` field under ``tag``."""
    cdef const char* kp
    cdef Py_ssize_t kn, vn
    cdef Buf av
    cdef unsigned char head[11]
    cdef Py_ssize_t hn = 1
    if type(key) is not str or not PyUnicode_IS_COMPACT_ASCII(key):
        _pieces(b, _attributes_ref({key: value}, bytes((tag,))))
        return 0
    kp = <const char*>PyUnicode_DATA(key)
    kn = PyUnicode_GET_LENGTH(key)
    if type(value) is str and PyUnicode_IS_COMPACT_ASCII(value):  # most values: copied once, from the str
        vn = PyUnicode_GET_LENGTH(value)
        head[0] = 0x0A
        while vn >= 128:  # the AnyValue's string tag and length
            head[hn] = <unsigned char>((vn & 0x7F) | 0x80)
            hn += 1
            vn >>= 7
        head[hn] = <unsigned char>vn
        hn += 1
        _key_value_field(b, tag, kp, kn, <const char*>head, hn, <const char*>PyUnicode_DATA(value),
                         PyUnicode_GET_LENGTH(value))
        return 0
    av.p = NULL
    av.n = av.cap = 0
    try:
        if _any_value(&av, value):  # the reference writes it, or logs and skips it
            _pieces(b, _attributes_ref({key: value}, bytes((tag,))))
            return 0
        _key_value_field(b, tag, kp, kn, av.p, av.n, NULL, 0)
        return 0
    finally:
        free(av.p)


cdef int _attributes(Buf* b, unsigned char tag, object attributes) except -1:
    cdef Py_ssize_t pos = 0
    cdef PyObject* k
    cdef PyObject* v
    if not attributes:
        return 0
    if type(attributes) is _MappingProxy:  # a ReadableSpan's: its items are walked in C
        for key, value in attributes.items():
            _attribute(b, tag, key, value)
        return 0
    if type(attributes) is not dict:
        # the SDK's BoundedAttributes (an event's, a live span's) hands out a plain dict copy in C
        # (``copy()``); walking it as a Mapping costs a Python call and a lock per key
        copy = getattr(attributes, "copy", None)
        plain = copy() if copy is not None else None
        if type(plain) is dict:
            attributes = plain
    if type(attributes) is dict:
        while PyDict_Next(attributes, &pos, &k, &v):
            _attribute(b, tag, <object>k, <object>v)
        return 0
    for key, value in attributes.items():
        _attribute(b, tag, key, value)
    return 0


cdef int _nested(Buf* b, unsigned char tag, Buf* body) except -1:
    """``tag`` + length + ``body``."""
    _byte(b, tag)
    _varint(b, body.n)
    _put(b, body.p, body.n)
    return 0


cdef int _event(Buf* b, object event, Buf* scratch) except -1:
    scratch.n = 0
    if _Event is not None and type(event) is _Event:
        ts = event._timestamp
        name = event._name
        attrs = event._attributes
        dropped = _dropped(attrs, _BoundedAttributes)
        attrs = _plain_attributes(attrs)
    else:
        ts = event.timestamp
        name = event.name
        attrs = event.attributes
        dropped = event.dropped_attributes
    if ts:
        _byte(scratch, 0x09)
        _fixed(scratch, <uint64_t>ts, 8)
    if name:
        _text_field(scratch, 0x12, name)
    _attributes(scratch, 0x1A, attrs)
    if dropped:
        _byte(scratch, 0x20)
        _varint(scratch, <uint64_t>dropped)
    _nested(b, 0x5A, scratch)
    return 0


cdef int _status(Buf* b, object status, Buf* scratch) except -1:
    if status is None:
        return 0
    scratch.n = 0
    if _Status is not None and type(status) is _Status:
        description = status._description
        code = status._status_code._value_
    else:
        description = status.description
        code = status.status_code.value
    if description:
        _text_field(scratch, 0x12, description)
    if code:
        _byte(scratch, 0x18)
        _varint(scratch, <uint64_t>code)
    _nested(b, 0x7A, scratch)
    return 0


def encode_span(span: object) -> bytes:
    """One ``Span`` message body from an SDK ``ReadableSpan`` (what ``otlp_encode.encode_span`` writes)."""
    cdef Buf b
    cdef Buf scratch
    cdef uint32_t flags
    cdef int mode = _mode(type(span))
    b.p = NULL
    b.n = b.cap = 0
    scratch.p = NULL
    scratch.n = scratch.cap = 0
    if mode:
        ctx = span._context
        parent = span._parent
        name = span._name
        kind = span._kind
        start = span._start_time
        end = span._end_time
        attrs = span._attributes
        events = span._events
        links = span._links
        status = span._status
        if mode == 1:
            dropped_attributes = _dropped(attrs, _BoundedAttributes)
            dropped_events = _dropped(events, _BoundedList)
            dropped_links = _dropped(links, _BoundedList)
        else:
            dropped_attributes = span.dropped_attributes
            dropped_events = span.dropped_events
            dropped_links = span.dropped_links
        attrs = _plain_attributes(attrs)
        events = _items(events)
        links = _items(links)
    else:
        ctx = span.get_span_context()
        parent = span.parent
        name = span.name
        kind = span.kind
        start = span.start_time
        end = span.end_time
        attrs = span.attributes
        dropped_attributes = span.dropped_attributes
        events = span.events
        dropped_events = span.dropped_events
        links = span.links
        dropped_links = span.dropped_links
        status = span.status
    trace_id, span_id, trace_state = context_fields(ctx, _SpanContext)
    if type(trace_state) is _TraceState:
        trace_state = trace_state._dict  # the same pairs, in the same order
    try:
        _grow(&b, 4096)
        _put(&b, b"\x0a\x10", 2)
        _big_endian(&b, trace_id, 16)
        _put(&b, b"\x12\x08", 2)
        _big_endian(&b, span_id, 8)
        if trace_state:
            _text_field(&b, 0x1A, ",".join([f"{k}={v}" for k, v in trace_state.items()]))
        if parent:
            _put(&b, b"\x22\x08", 2)
            _big_endian(&b, <object>PyTuple_GET_ITEM(parent, 1) if type(parent) is _SpanContext
                        else parent.span_id, 8)
        if name:
            _text_field(&b, 0x2A, name)
        _byte(&b, 0x30)
        _byte(&b, <unsigned char>(<int>_KIND[kind]))
        if start:
            _byte(&b, 0x39)
            _fixed(&b, <uint64_t>start, 8)
        if end:
            _byte(&b, 0x41)
            _fixed(&b, <uint64_t>end, 8)
        _attributes(&b, 0x4A, attrs)
        if dropped_attributes:
            _byte(&b, 0x50)
            _varint(&b, <uint64_t>dropped_attributes)
        for event in events:
            _event(&b, event, &scratch)
        if dropped_events:
            _byte(&b, 0x60)
            _varint(&b, <uint64_t>dropped_events)
        for link in links:
            data = _link_ref(link)
            _put(&b, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
        if dropped_links:
            _byte(&b, 0x70)
            _varint(&b, <uint64_t>dropped_links)
        _status(&b, status, &scratch)
        flags = 0x100
        if parent is not None and (<object>PyTuple_GET_ITEM(parent, 2) if type(parent) is _SpanContext
                                   else parent.is_remote):
            flags |= 0x200
        _put(&b, b"\x85\x01", 2)
        _fixed(&b, flags, 4)
        return PyBytes_FromStringAndSize(b.p, b.n)
    finally:
        free(b.p)
        free(scratch.p)
