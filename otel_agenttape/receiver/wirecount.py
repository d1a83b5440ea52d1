"""How many spans (or log records) a serialized OTLP request holds, read off the wire before it is decoded.

A request's memory while it is decoded and converted grows with its item count, not its size (an
empty span is 2 bytes on the wire and about 1 KB as rows), so the receiver refuses a request over
``--max-spans-per-request`` before it parses it. ``ExportTraceServiceRequest`` and
``ExportLogsServiceRequest`` nest alike: field 1 (resource spans/logs), field 2 (scope spans/logs),
field 2 (spans/log records); only lengths are read, nothing is copied. The count stops once past
``limit``, and stops (returning what it has) at the first malformed field: decoding the request
then says what is wrong with it. ``_wirecount.pyx`` is the compiled twin.
"""

from __future__ import annotations

from otel_agenttape import native

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_WANTED = (1, 2, 2)  # the field holding the next level, at depths 0, 1 and 2 (items)


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; position -1 when it runs past ``end``."""
    value = shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            break
    return 0, -1


def _walk(buf: bytes, pos: int, end: int, depth: int, limit: int, count: int) -> tuple[int, bool]:
    """(count so far, go on) over the fields in ``buf[pos:end]`` at nesting ``depth``."""
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        if pos < 0:
            return count, False
        field, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            _, pos = _varint(buf, pos, end)
            if pos < 0:
                return count, False
        elif wire == _FIXED64:
            pos += 8
        elif wire == _FIXED32:
            pos += 4
        elif wire == _LEN:
            n, pos = _varint(buf, pos, end)
            if pos < 0 or pos + n > end:
                return count, False
            if field == _WANTED[depth]:
                if depth == 2:
                    count += 1
                    if count > limit:
                        return count, False
                else:
                    count, go_on = _walk(buf, pos, pos + n, depth + 1, limit, count)
                    if not go_on:
                        return count, False
            pos += n
        else:  # groups (deprecated) and unknown wire types: not OTLP
            return count, False
    return count, pos == end


def count_items_py(body: bytes, limit: int) -> int:
    """Items in a serialized OTLP trace or logs request, counted up to ``limit + 1`` (pure Python)."""
    return _walk(body, 0, len(body), 0, limit, 0)[0]


_compiled = native.load("otel_agenttape.receiver._wirecount")
count_items = _compiled.count_items if _compiled is not None else count_items_py
