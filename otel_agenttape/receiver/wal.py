"""Write-ahead log: an accepted request is on disk (fsync'd) before the client gets its 200/OK.

Records are appended to numbered segment files by one flusher thread that batches every record
waiting at that moment into a single write + fdatasync (group commit), so concurrent requests
share one disk flush. Each record carries a CRC: a torn tail left by a crash is cut off at replay.
Once the store holds every record of a segment, the segment is deleted.

Record layout: ``<u32 payload length><u32 crc32(kind + payload)><u8 kind>`` then the payload
(a serialized ``Export*ServiceRequest``).
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

KIND_TRACES = 1
KIND_LOGS = 2

_HEADER = struct.Struct("<IIB")
_SUFFIX = ".wal"
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


class WalClosed(RuntimeError):
    """Append after ``close()``."""


def _segment_name(number: int) -> str:
    return f"{number:012d}{_SUFFIX}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_IOV_MAX = 512  # buffers per writev call (Linux allows 1024)


def _write_all(fd: int, chunks: list[bytes]) -> None:
    """Write the chunks in order with ``writev``: no joined copy of the records in memory."""
    pending = [memoryview(c) for c in chunks if c]
    while pending:
        n = os.writev(fd, pending[:_IOV_MAX])
        while n:
            if n >= len(pending[0]):
                n -= len(pending.pop(0))
            else:
                pending[0] = pending[0][n:]
                n = 0


def read_segment(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield ``(kind, payload)`` of every intact record; stops at the first torn or corrupt one."""
    with open(path, "rb") as fh:
        data = fh.read()
    pos, end = 0, len(data)
    while pos + _HEADER.size <= end:
        length, crc, kind = _HEADER.unpack_from(data, pos)
        start = pos + _HEADER.size
        stop = start + length
        if stop > end:
            return
        payload = data[start:stop]
        if zlib.crc32(payload, zlib.crc32(bytes((kind,)))) != crc:
            return
        yield kind, payload
        pos = stop


class WriteAheadLog:
    """Durable, group-committed append log in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._flushed = threading.Condition(self._lock)
        self._work = threading.Condition(self._lock)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._next_seq = 1  # seq of the next appended record
        self._durable_seq = 0  # every record with seq <= this is on disk
        self._applied_seq = 0  # every record with seq <= this is in the store
        self._unapplied: set[int] = set()  # durable records not yet in the store
        self._segment_last_seq: dict[int, int] = {}  # closed segment number -> last seq in it
        self._error: BaseException | None = None
        self._closed = False
        self.fsyncs = 0
        self.bytes_written = 0
        existing = self.segments()
        self._replay_segments = existing
        self._seg_no = (int(existing[-1].stem) + 1) if existing else 1
        self._fh = self._open_segment(self._seg_no)
        self._seg_size = 0
        self._thread = threading.Thread(target=self._run, name="agenttape-wal", daemon=True)
        self._thread.start()

    def segments(self) -> list[Path]:
        """Segment files on disk, oldest first."""
        return sorted(p for p in self.dir.glob("*" + _SUFFIX) if p.stem.isdigit())

    def pending_replay(self) -> list[Path]:
        """Segments that existed when the log was opened (written by an earlier process)."""
        return list(self._replay_segments)

    def replay(self) -> Iterator[tuple[int, bytes]]:
        """Records of the segments found at open, in order (a crash may have left them unapplied)."""
        for path in self._replay_segments:
            yield from read_segment(path)

    def drop_replayed(self) -> None:
        """Delete the replayed segments once their records are in the store."""
        for path in self._replay_segments:
            path.unlink(missing_ok=True)
        self._replay_segments = []
        _fsync_dir(self.dir)

    def _open_segment(self, number: int):  # noqa: ANN202 - a binary file object
        fh = open(self.dir / _segment_name(number), "ab", buffering=0)
        _fsync_dir(self.dir)
        return fh

    def append(self, kind: int, payload: bytes | memoryview) -> int:
        """Append one record and return its sequence number once it is fsync'd to disk."""
        payload = bytes(payload)
        header = _HEADER.pack(len(payload), zlib.crc32(payload, zlib.crc32(bytes((kind,)))), kind)
        with self._lock:
            if self._closed:
                raise WalClosed("write-ahead log is closed")
            if self._error is not None:
                raise OSError(f"write-ahead log failed: {self._error}")
            seq = self._next_seq
            self._next_seq += 1
            self._pending.append(header)
            self._pending.append(payload)
            self._pending_bytes += len(header) + len(payload)
            self._work.notify()
            while self._durable_seq < seq:
                if self._error is not None:
                    raise OSError(f"write-ahead log failed: {self._error}")
                self._flushed.wait()
        return seq

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._work.wait()
                if not self._pending and self._closed:
                    return
                chunks, self._pending = self._pending, []
                size, self._pending_bytes = self._pending_bytes, 0
                last_seq = self._next_seq - 1
                first_seq = last_seq - len(chunks) // 2 + 1
            try:
                _write_all(self._fh.fileno(), chunks)
                os.fdatasync(self._fh.fileno())
            except BaseException as exc:  # disk full, I/O error: every waiter must learn it
                with self._lock:
                    self._error = exc
                    self._flushed.notify_all()
                return
            self.fsyncs += 1
            self.bytes_written += size
            self._seg_size += size
            rotate = self._seg_size >= self.segment_bytes
            with self._lock:
                self._unapplied.update(range(first_seq, last_seq + 1))
                self._durable_seq = last_seq
                self._flushed.notify_all()
                if rotate:
                    self._segment_last_seq[self._seg_no] = last_seq
            if rotate:
                self._fh.close()
                self._seg_no += 1
                self._fh = self._open_segment(self._seg_no)
                self._seg_size = 0
                self._collect()

    def mark_applied(self, seqs: list[int]) -> None:
        """These records are in the store: delete segments that hold nothing still unapplied."""
        with self._lock:
            self._unapplied.difference_update(seqs)
            self._applied_seq = (min(self._unapplied) - 1) if self._unapplied else self._durable_seq
        self._collect()

    def _collect(self) -> None:
        with self._lock:
            done = [n for n, last in self._segment_last_seq.items() if last <= self._applied_seq]
            for n in done:
                del self._segment_last_seq[n]
        for n in done:
            (self.dir / _segment_name(n)).unlink(missing_ok=True)

    @property
    def lag_records(self) -> int:
        """Records durable in the log but not yet in the store."""
        return len(self._unapplied)

    @property
    def disk_bytes(self) -> int:
        """Bytes of segment files currently on disk."""
        total = 0
        for p in self.segments():
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def close(self, applied_all: bool = False) -> None:
        """Flush and stop; with ``applied_all`` (the store holds everything) the segments are deleted."""
        with self._lock:
            self._closed = True
            self._work.notify_all()
        self._thread.join()
        self._fh.close()
        if applied_all and self._error is None:
            for p in self.segments():
                p.unlink(missing_ok=True)
            try:
                self.dir.rmdir()  # only when empty
            except OSError:
                _fsync_dir(self.dir)
