"""Write-ahead log: an accepted request is on disk (fsync'd) before the client gets its 200/OK.

Records are appended to numbered segment files by one flusher thread that batches every record
waiting at that moment into a single write + fdatasync (group commit), so concurrent requests
share one disk flush. Each record carries a CRC: a torn tail left by a crash is cut off at replay.
Once the store holds every record of a segment, the segment is deleted.

A failed write (disk full, I/O error) fails only the requests of that group: their ``append`` raises
``OSError`` (the transport answers 503, the client retries), the bytes of the group are cut off the
segment again, and the flusher keeps running. While the last write failed, ``error`` holds the reason
(``/healthz`` reports it) and the flusher probes the disk every second with a small write of its own,
so the log is healthy again as soon as space is back, without a restart.

Record layout (``walfile.py``): ``<u32 payload length><u32 crc32(kind + payload)><u8 kind>`` then the payload
(a serialized ``Export*ServiceRequest``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from otel_agenttape.walfile import KIND_LOGS, KIND_TRACES, read_segment, record_header  # noqa: F401 - re-exported
from otel_agenttape.walfile import SUFFIX as _SUFFIX
from otel_agenttape.walfile import segment_name as _segment_name

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
_PROBE_NAME = ".probe"
_PROBE_BYTES = 64 * 1024
_PROBE_SECONDS = 1.0


class WalClosed(RuntimeError):
    """Append after ``close()``."""


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


class WriteAheadLog:
    """Durable, group-committed append log in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._files = threading.Lock()  # a closed segment is deleted or rewritten under it, not both
        self._flushed = threading.Condition(self._lock)
        self._work = threading.Condition(self._lock)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._next_seq = 1  # seq of the next appended record
        self._durable_seq = 0  # every record with seq <= this is on disk
        self._applied_seq = 0  # every record with seq <= this is in the store
        self._unapplied: set[int] = set()  # durable records not yet in the store
        self._segment_last_seq: dict[int, int] = {}  # closed segment number -> last seq in it
        self._error: BaseException | None = None  # the last write failed with this (None once one succeeds)
        self._failed: dict[int, BaseException] = {}  # seq -> why its write failed, until append reports it
        self._done_seq = 0  # every record with seq <= this was written or failed
        self._closed = False
        self._rotate_asked = False  # ``rotate()``: the flusher starts a new segment at its next turn
        self.write_errors = 0
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
        header = record_header(kind, payload)
        with self._lock:
            if self._closed:
                raise WalClosed("write-ahead log is closed")
            seq = self._next_seq
            self._next_seq += 1
            self._pending.append(header)
            self._pending.append(payload)
            self._pending_bytes += len(header) + len(payload)
            self._work.notify()
            while self._done_seq < seq:
                self._flushed.wait()
            failed = self._failed.pop(seq, None)
            if failed is not None:
                raise OSError(f"write-ahead log failed: {failed}")
        return seq

    @property
    def error(self) -> BaseException | None:
        """Why the last write failed, while no write since has succeeded (None when healthy)."""
        return self._error

    def _probe(self) -> None:
        """Write, fsync and delete a small file beside the segments: clears ``error`` once it works."""
        path = self.dir / _PROBE_NAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, [bytes(_PROBE_BYTES)])
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with self._lock:
                self._error = exc
            return
        finally:
            try:
                path.unlink()
            except OSError:
                pass
        with self._lock:
            self._error = None

    def _fail(self, exc: BaseException, first_seq: int, last_seq: int) -> None:
        """A group's write failed: cut its bytes off the segment and fail exactly its appends."""
        try:
            os.ftruncate(self._fh.fileno(), self._seg_size)  # shrinking needs no free space
        except OSError:
            # the segment cannot be mended: continue in a new one (replay stops at the torn tail)
            self._rotate(self._durable_seq)
        with self._lock:
            self._error = exc
            self.write_errors += 1
            for seq in range(first_seq, last_seq + 1):
                self._failed[seq] = exc
            self._done_seq = last_seq
            self._flushed.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    if self._rotate_asked:
                        self._rotate_asked = False
                        self._lock.release()
                        try:
                            if self._rotate(self._durable_seq):
                                self._collect()
                        finally:
                            self._lock.acquire()
                        self._flushed.notify_all()
                        continue
                    if self._error is not None:
                        self._lock.release()
                        try:
                            self._probe()
                        finally:
                            self._lock.acquire()
                        if self._error is not None and not self._pending and not self._closed:
                            self._work.wait(_PROBE_SECONDS)
                        continue
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
            except OSError as exc:  # disk full, I/O error: the waiters of this group must learn it
                self._fail(exc, first_seq, last_seq)
                continue
            except BaseException as exc:  # not an I/O error: fail this group, stop the flusher
                self._fail(exc, first_seq, last_seq)
                with self._lock:
                    self._closed = True
                    for seq in range(last_seq + 1, self._next_seq):
                        self._failed[seq] = exc
                    self._done_seq = self._next_seq - 1
                    self._flushed.notify_all()
                return
            self.fsyncs += 1
            self.bytes_written += size
            self._seg_size += size
            with self._lock:
                self._unapplied.update(range(first_seq, last_seq + 1))
                self._durable_seq = self._done_seq = last_seq
                self._error = None
                self._flushed.notify_all()
            with self._lock:
                asked, self._rotate_asked = self._rotate_asked, False
            if (asked or self._seg_size >= self.segment_bytes) and self._rotate(last_seq):
                self._collect()
            if asked:
                with self._lock:
                    self._flushed.notify_all()

    def _rotate(self, last_seq: int) -> bool:
        """Continue in a new segment; the old one (records up to ``last_seq``) is deleted once applied.
        False (and the current segment kept) when the new file cannot be created."""
        try:
            fh = self._open_segment(self._seg_no + 1)
        except OSError as exc:
            log.warning("cannot start a new write-ahead log segment (%s); continuing in %s", exc,
                        _segment_name(self._seg_no))
            return False
        old, self._fh = self._fh, fh
        old.close()
        with self._lock:
            self._segment_last_seq[self._seg_no] = last_seq
        self._seg_no += 1
        self._seg_size = 0
        return True

    def rotate(self, timeout: float = 10.0) -> bool:
        """Continue in a new segment, so the current one is deleted as soon as its records are in the
        store (an erasure: no segment keeps a value the store no longer holds). Waits for the flusher."""
        with self._lock:
            if self._closed:
                return False
            start = self._seg_no
            self._rotate_asked = True
            self._work.notify()
            return self._flushed.wait_for(lambda: self._seg_no != start or self._closed, timeout)

    def closed_segments(self) -> list[Path]:
        """Segments on disk that are no longer written to (all but the current one)."""
        with self._lock:
            current = self._seg_no
        return [p for p in self.segments() if int(p.stem) < current]

    def wait_gone(self, paths: list[Path], timeout: float) -> list[Path]:
        """Wait until these closed segments are deleted (their records are in the store); the ones left."""
        deadline = time.monotonic() + timeout
        left = [p for p in paths if p.exists()]
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [p for p in left if p.exists()]
        return left

    def rewrite_closed(self, paths: list[Path], rewrite: Callable[[Path], bool]) -> int:
        """Call ``rewrite(path)`` on each of these closed segments still on disk, with none deleted meanwhile
        (an erasure reaching records not yet in the store); returns how many it rewrote."""
        done = 0
        with self._files:
            for path in paths:
                if path.exists() and rewrite(path):
                    done += 1
        return done

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
        with self._files:
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
