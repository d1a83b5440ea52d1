"""The receiver's write-ahead log file format: segments of checksummed records (standard library only).

``receiver/wal.py`` appends and replays them; erasure (``store/erasure_copies.py``) rewrites a segment
with erased values left out. A record is ``<u32 payload length><u32 crc32(kind + payload)><u8 kind>``
then the payload (a serialized ``Export*ServiceRequest``); a torn or corrupt record ends a segment.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

KIND_TRACES = 1
KIND_LOGS = 2
HEADER = struct.Struct("<IIB")
SUFFIX = ".wal"


def segment_name(number: int) -> str:
    return f"{number:012d}{SUFFIX}"


def segments(directory: str | os.PathLike[str]) -> list[Path]:
    """Segment files in ``directory``, oldest first."""
    return sorted(p for p in Path(directory).glob("*" + SUFFIX) if p.stem.isdigit())


def record_header(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), zlib.crc32(payload, zlib.crc32(bytes((kind,)))), kind)


def read_segment(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """Yield ``(kind, payload)`` of every intact record; stops at the first torn or corrupt one."""
    with open(path, "rb") as fh:
        data = fh.read()
    pos, end = 0, len(data)
    while pos + HEADER.size <= end:
        length, crc, kind = HEADER.unpack_from(data, pos)
        start = pos + HEADER.size
        stop = start + length
        if stop > end:
            return
        payload = data[start:stop]
        if zlib.crc32(payload, zlib.crc32(bytes((kind,)))) != crc:
            return
        yield kind, payload
        pos = stop
