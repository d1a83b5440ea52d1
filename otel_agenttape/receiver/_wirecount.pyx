# cython: boundscheck=False, wraparound=False
"""Compiled twin of ``wirecount.count_items_py``: items of a serialized OTLP request, read off the wire."""

cdef int _WANTED[3]
_WANTED[0] = 1
_WANTED[1] = 2
_WANTED[2] = 2


cdef Py_ssize_t _varint(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end, unsigned long long* out) nogil:
    cdef unsigned long long value = 0
    cdef int shift = 0
    cdef unsigned char b
    while pos < end:
        b = buf[pos]
        pos += 1
        value |= (<unsigned long long>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = value
            return pos
        shift += 7
        if shift > 63:
            break
    return -1


cdef Py_ssize_t _walk(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end, int depth,
                      Py_ssize_t limit, Py_ssize_t* count) nogil:
    """Returns 1 to go on, 0 to stop."""
    cdef unsigned long long tag, n
    cdef unsigned long long field
    cdef int wire
    while pos < end:
        pos = _varint(buf, pos, end, &tag)
        if pos < 0:
            return 0
        field = tag >> 3
        wire = tag & 7
        if wire == 0:
            pos = _varint(buf, pos, end, &n)
            if pos < 0:
                return 0
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            pos = _varint(buf, pos, end, &n)
            if pos < 0 or n > <unsigned long long>(end - pos):
                return 0
            if field == <unsigned long long>_WANTED[depth]:
                if depth == 2:
                    count[0] += 1
                    if count[0] > limit:
                        return 0
                elif not _walk(buf, pos, pos + <Py_ssize_t>n, depth + 1, limit, count):
                    return 0
            pos += <Py_ssize_t>n
        else:
            return 0
    return 1 if pos == end else 0


def count_items(bytes body, Py_ssize_t limit):
    """Items in a serialized OTLP trace or logs request, counted up to ``limit + 1``."""
    cdef Py_ssize_t count = 0
    cdef const unsigned char* buf = body
    cdef Py_ssize_t size = len(body)
    with nogil:
        _walk(buf, 0, size, 0, limit, &count)
    return count
