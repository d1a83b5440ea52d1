"""The outbox's file format: append-only segment files of checksummed records, and an acknowledged
offset, in lanes that one process writes at a time.

Capture writes spans it could not deliver here and re-sends them later; ``agenttape ingest OUTBOX``
reads the same files. Like the OpenTelemetry Collector's persistent queue (a write index, a read index
and the items between them, in ``file_storage``), the lane keeps what was written (the segments) and
how far the receiver acknowledged it (``acked``), so a process that died after sending but before
acknowledging re-sends that record: delivery is at least once, and the receiver's span-id dedup makes
it exactly once in the store. Only the standard library is used (layer 0).

Layout of an outbox folder::

    OUTBOX/lane-<16 hex>/lock                    held (flock) by the process that owns the lane
    OUTBOX/lane-<16 hex>/acked                   "<segment> <offset>": the first record not acknowledged
    OUTBOX/lane-<16 hex>/dropped                 "<spans>": spans dropped because the outbox was full
    OUTBOX/lane-<16 hex>/<20 digits>.seg         segments, in order; each starts with SEGMENT_MAGIC
    OUTBOX/logs/lane-<16 hex>/...                log records, in lanes of their own (``LOGS_FOLDER``)

A record is a 16-byte little-endian header (``RECORD_MAGIC`` u16, kind u8, flags u8, payload length
u32, item count u32, CRC-32 u32 of the first 12 header bytes and the payload) and the payload: for
``KIND_TRACES`` one serialized OTLP ``ExportTraceServiceRequest``, for ``KIND_LOGS`` one
``ExportLogsServiceRequest`` (only in the ``logs`` folder, so a lane's consecutive records can always be
sent as one request). A record cut short by a crash (a torn
tail) fails its length or checksum test: readers stop there, and the owner truncates it away before it
appends, so it never affects the records before it.
"""

from __future__ import annotations

import collections
import errno
import os
import secrets
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from otel_agenttape.atomicfile import fsync_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: lanes are not locked
    fcntl = None  # type: ignore[assignment]

SEGMENT_MAGIC = b"ATOUTBX1"
RECORD_MAGIC = 0xB07A
KIND_TRACES = 1
KIND_LOGS = 2
LOGS_FOLDER = "logs"
_HEADER = struct.Struct("<HBBIII")
HEADER_SIZE = _HEADER.size
SEGMENT_SUFFIX = ".seg"
LANE_PREFIX = "lane-"
ACK_FILE = "acked"
LOCK_FILE = "lock"
DROPPED_FILE = "dropped"
MAX_RECORD_BYTES = 256 << 20  # a length beyond this is a torn or corrupt header, not a record


class OutboxFormatError(ValueError):
    """A file that is not an outbox segment (wrong magic)."""


@dataclass(frozen=True)
class Record:
    """One record: where it is (segment number, byte offsets) and what it holds."""

    segment: int
    offset: int
    end: int
    kind: int
    items: int
    payload: bytes


def encode_record(kind: int, items: int, payload: bytes) -> bytes:
    """Header and payload of one record, ready to append."""
    head = struct.pack("<HBBII", RECORD_MAGIC, kind, 0, len(payload), items)
    crc = zlib.crc32(payload, zlib.crc32(head))
    return head + struct.pack("<I", crc) + payload


@dataclass
class Scan:
    """What reading a segment found: its records from the start offset and where the good data ends."""

    records: list[Record]
    good_end: int
    torn_bytes: int  # bytes after good_end that do not form a whole, valid record


def scan_segment(path: str | os.PathLike[str], number: int, start: int = len(SEGMENT_MAGIC)) -> Scan:
    """Read the records of one segment from ``start``; stops at the first torn or corrupt record."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(SEGMENT_MAGIC):
        if len(data) < len(SEGMENT_MAGIC) and SEGMENT_MAGIC.startswith(data):
            return Scan([], 0, len(data))  # a segment created just before a crash
        raise OutboxFormatError(f"{path}: not an outbox segment")
    pos = max(start, len(SEGMENT_MAGIC))
    records = []
    while pos + HEADER_SIZE <= len(data):
        magic, kind, _flags, length, items, crc = _HEADER.unpack_from(data, pos)
        end = pos + HEADER_SIZE + length
        if magic != RECORD_MAGIC or length > MAX_RECORD_BYTES or end > len(data):
            break
        payload = data[pos + HEADER_SIZE:end]
        if zlib.crc32(payload, zlib.crc32(data[pos:pos + 12])) != crc:
            break
        records.append(Record(number, pos, end, kind, items, payload))
        pos = end
    return Scan(records, pos, len(data) - pos)


def lanes(root: str | os.PathLike[str]) -> list[Path]:
    """The lane folders of an outbox, oldest name first (an absent outbox has none)."""
    p = Path(root)
    if not p.is_dir():
        return []
    return sorted(d for d in p.iterdir() if d.is_dir() and d.name.startswith(LANE_PREFIX))


def segments(lane: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(number, path)`` of a lane's segments, in order."""
    out = []
    for f in Path(lane).glob(f"*{SEGMENT_SUFFIX}"):
        stem = f.name[: -len(SEGMENT_SUFFIX)]
        if stem.isdigit():
            out.append((int(stem), f))
    return sorted(out)


def read_ack(lane: str | os.PathLike[str]) -> tuple[int, int]:
    """``(segment, offset)`` of the first record not acknowledged; (0, 0) when nothing was."""
    try:
        seg, off = (Path(lane) / ACK_FILE).read_text(encoding="ascii").split()
        return int(seg), int(off)
    except (OSError, ValueError):
        return 0, 0


def write_ack(lane: str | os.PathLike[str], segment: int, offset: int, fsync: bool = True) -> None:
    """Replace the acknowledged offset atomically (write, fsync, rename)."""
    path = Path(lane) / ACK_FILE
    tmp = path.with_name(ACK_FILE + ".tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{segment} {offset}\n")
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_dropped(lane: str | os.PathLike[str]) -> int:
    """Spans this lane's writers dropped because the outbox was full (kept across processes)."""
    try:
        return int((Path(lane) / DROPPED_FILE).read_text(encoding="ascii").strip() or 0)
    except (OSError, ValueError):
        return 0


def add_dropped(lane: str | os.PathLike[str], n: int) -> None:
    """Add ``n`` to the lane's count of dropped spans (``agenttape doctor`` reports it)."""
    path = Path(lane) / DROPPED_FILE
    tmp = path.with_name(DROPPED_FILE + ".tmp")
    tmp.write_text(f"{read_dropped(lane) + n}\n", encoding="ascii")
    os.replace(tmp, path)


@dataclass
class Summary:
    """What an outbox folder holds, for ``agenttape doctor``."""

    lanes: int = 0
    lanes_in_use: int = 0
    records: int = 0
    spans: int = 0
    bytes: int = 0
    torn_bytes: int = 0
    dropped: int = 0


def summarize(root: str | os.PathLike[str]) -> Summary:
    """Count pending records and spans, torn tails and dropped spans, without changing anything."""
    out = Summary()
    for lane in lanes(root):
        out.lanes += 1
        fd = try_lock(lane)
        if fd is None:
            out.lanes_in_use += 1
        else:
            os.close(fd)
        out.dropped += read_dropped(lane)
        ack_seg, ack_off = read_ack(lane)
        for number, path in segments(lane):
            if number < ack_seg:
                continue
            scan = scan_segment(path, number, ack_off if number == ack_seg else 0)
            out.records += len(scan.records)
            out.spans += sum(r.items for r in scan.records)
            out.bytes += sum(r.end - r.offset for r in scan.records)
            out.torn_bytes += scan.torn_bytes
    return out


def pending(lane: str | os.PathLike[str]) -> Iterator[Record]:
    """Every record of a lane after its acknowledged offset, in order (read-only)."""
    ack_seg, ack_off = read_ack(lane)
    for number, path in segments(lane):
        if number < ack_seg:
            continue
        yield from scan_segment(path, number, ack_off if number == ack_seg else 0).records


def read_outbox(root: str | os.PathLike[str]) -> Iterator[Record]:
    """Every record not yet acknowledged, lane after lane; raises ``OutboxFormatError`` on a foreign file."""
    for lane in lanes(root):
        yield from pending(lane)


def is_outbox(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an outbox folder (it has a lane, of spans or of log records)."""
    return bool(lanes(path)) or bool(lanes(Path(path) / LOGS_FOLDER))


class Lane:
    """The lane a process owns: it appends records and acknowledges them; nobody else writes it.

    ``open_lane`` takes a free lane (one whose owner is gone: a crashed process's records are then
    re-sent by this one) or makes a new one. Appends, reads and acknowledgements are called under
    the caller's lock.
    """

    def __init__(self, path: Path, lock_fd: int | None, segment_bytes: int) -> None:
        self.path = path
        self._lock_fd = lock_fd
        self.segment_bytes = segment_bytes
        self.torn_bytes = 0
        self._ack = read_ack(path)
        self._records: collections.deque[Record] = collections.deque()  # pending, metadata only
        self._items = self._bytes = 0
        segs = segments(path)
        for number, seg_path in segs:
            if number < self._ack[0]:
                seg_path.unlink(missing_ok=True)
                continue
            scan = scan_segment(seg_path, number, self._ack[1] if number == self._ack[0] else 0)
            if scan.torn_bytes:
                self.torn_bytes += scan.torn_bytes
                _truncate(seg_path, max(scan.good_end, 0))
            for r in scan.records:
                self._keep(Record(r.segment, r.offset, r.end, r.kind, r.items, b""))
        live = [n for n, _ in segments(path)]
        self._segment = live[-1] if live else max(self._ack[0], 1)
        self._file = None
        self._size = 0
        self._open_segment(self._segment)

    # ---- appending -----------------------------------------------------------------------
    def _open_segment(self, number: int) -> None:
        if self._file is not None:
            self._file.close()
        path = self.path / f"{number:020d}{SEGMENT_SUFFIX}"
        self._file = open(path, "ab")
        self._segment = number
        self._size = self._file.tell()
        if self._size < len(SEGMENT_MAGIC):
            self._file.truncate(0)
            self._file.write(SEGMENT_MAGIC)
            self._file.flush()
            self._size = len(SEGMENT_MAGIC)
            fsync_dir(self.path)

    def append(self, kind: int, items: int, payload: bytes, fsync: bool = True) -> int:
        """Append one record (fsync'd unless ``fsync`` is False); returns the bytes written."""
        if self._size > len(SEGMENT_MAGIC) and self._size + HEADER_SIZE + len(payload) > self.segment_bytes:
            self._open_segment(self._segment + 1)
        blob = encode_record(kind, items, payload)
        start = self._size
        f = self._file
        try:
            f.write(blob)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        except OSError:
            try:  # leave no partial record behind for the next append to follow
                f.truncate(start)
            except OSError:
                pass
            raise
        self._size = start + len(blob)
        self._keep(Record(self._segment, start, self._size, kind, items, b""))
        return len(blob)

    def _keep(self, meta: Record) -> None:
        self._records.append(meta)
        self._items += meta.items
        self._bytes += meta.end - meta.offset

    # ---- reading and acknowledging ---------------------------------------------------------
    @property
    def pending_records(self) -> int:
        return len(self._records)

    @property
    def pending_items(self) -> int:
        return self._items

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def first(self) -> Record | None:
        """The oldest record not acknowledged, with its payload."""
        return self.first_records(0)[0] if self._records else None

    def first_records(self, max_bytes: int) -> list[Record]:
        """The oldest records not acknowledged, with their payloads: as many as fit in ``max_bytes``
        of payload (at least one), in order."""
        out: list[Record] = []
        total = 0
        for meta in self._records:
            size = meta.end - meta.offset - HEADER_SIZE
            if out and (total + size > max_bytes or meta.kind != out[0].kind):
                break
            path = self.path / f"{meta.segment:020d}{SEGMENT_SUFFIX}"
            with open(path, "rb") as f:
                f.seek(meta.offset + HEADER_SIZE)
                out.append(Record(meta.segment, meta.offset, meta.end, meta.kind, meta.items, f.read(size)))
            total += size
        return out

    def ack_first(self, fsync: bool = True, count: int = 1) -> None:
        """The oldest ``count`` records were delivered: move the acknowledged offset past them, drop
        spent segments."""
        last = self._records[count - 1]
        write_ack(self.path, last.segment, last.end, fsync)
        for _ in range(count):
            meta = self._records.popleft()
            self._items -= meta.items
            self._bytes -= meta.end - meta.offset
        self._ack = (last.segment, last.end)
        nxt = self._records[0].segment if self._records else self._segment
        for number, seg_path in segments(self.path):
            if number < nxt and number != self._segment:
                seg_path.unlink(missing_ok=True)
        if not self._records and self._size > len(SEGMENT_MAGIC) + (self.segment_bytes // 2):
            self._open_segment(self._segment + 1)  # start afresh so the spent one can go
            for number, seg_path in segments(self.path):
                if number < self._segment:
                    seg_path.unlink(missing_ok=True)

    def forget(self) -> None:
        """In a forked child: drop the inherited handles without touching the parent's lock or files."""
        self._file = None
        if self._lock_fd is not None:
            try:
                os.close(self._lock_fd)  # the parent's descriptor of the same lock stays: it keeps the lane
            except OSError:
                pass
            self._lock_fd = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())


def try_lock(lane: Path) -> int | None:
    """The lane's lock, if no live process holds it (released when the fd is closed or the process dies)."""
    fd = os.open(lane / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return fd


def open_lane(root: str | os.PathLike[str], segment_bytes: int = 8 << 20) -> tuple[Lane, list[Lane]]:
    """``(own lane, other free lanes)``: the first free lane becomes this process's; the rest are
    adopted (their records re-sent, then removed). A new lane is made when none is free."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    taken = []
    for lane in lanes(base):
        fd = try_lock(lane)
        if fd is not None:
            taken.append(Lane(lane, fd, segment_bytes))
    if taken:
        return taken[0], taken[1:]
    path = base / f"{LANE_PREFIX}{secrets.token_hex(8)}"
    path.mkdir()
    fd = try_lock(path)
    return Lane(path, fd, segment_bytes), []


def adopt_free_lanes(root: str | os.PathLike[str], held: set[Path], segment_bytes: int = 8 << 20) -> list[Lane]:
    """Lanes whose owner has gone since we looked (a process that died), not already held."""
    out = []
    for lane in lanes(root):
        if lane in held:
            continue
        fd = try_lock(lane)
        if fd is not None:
            out.append(Lane(lane, fd, segment_bytes))
    return out


def remove_lane(lane: Lane) -> None:
    """Delete a lane whose records were all acknowledged (an adopted one)."""
    path = lane.path
    for _, seg in segments(path):
        seg.unlink(missing_ok=True)
    for name in (ACK_FILE, ACK_FILE + ".tmp", DROPPED_FILE, DROPPED_FILE + ".tmp"):
        (path / name).unlink(missing_ok=True)
    (path / LOCK_FILE).unlink(missing_ok=True)
    lane.close()
    try:
        path.rmdir()
    except OSError:
        pass
