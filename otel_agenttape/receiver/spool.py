"""Hand-off of request bodies and Arrow rows between the receiver and its converter processes.

A pipe between processes costs a pickle, many small reads and writes and a copy on each side; at tens
of thousands of spans per second that is several microseconds of the main process per span. Instead,
bodies and rows go through files in a private folder in shared memory (``/dev/shm`` when there is
one): a body is one write and one read, and the rows come back as Arrow IPC streams that the main
process maps without copying. Folders left by a killed server are removed when the next pool starts.

Files are written again rather than made anew: a new file in shared memory costs a page allocation
(zeroed) per 4 KB on the writing side and freeing it on the other, about 1.2 us per 4 KB against 0.3
for overwriting pages already there. The main process keeps the files it is done with (``Recycler``):
a body file once the worker has answered, a rows file once nothing maps it any more, and hands one
of each with every request. A file is overwritten from its start and cut to what was written, so it
never holds the tail of an earlier request (an erasure relies on it); the reader is told how many
bytes (body) or where the streams are (rows).
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

_PREFIX = "agenttape-spool-"
_SHM = "/dev/shm"
_KEEP_BYTES = 16 << 20  # a larger file (one huge request) is removed after use
KEEP_TOTAL = 128 << 20  # per recycler, unless the receiver's memory budget says otherwise


def _base() -> str:
    if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK | os.X_OK):
        return _SHM
    return tempfile.gettempdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove the spool folders of processes that are gone (a killed receiver's request bodies and rows
    stay in them until then; erasure calls this so no copy of an erased value is left there). Returns
    the folders removed."""
    gone = []
    for path in Path(_base()).glob(_PREFIX + "*"):
        try:
            pid = int(path.name[len(_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            gone.append(str(path))
    return gone


def create() -> str:
    """A new spool folder for this process (and remove those of processes that are gone)."""
    remove_stale()
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_base())


def remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


class Recycler:
    """Spool files of one kind whose pages can be written again (main process side, thread-safe).
    Under load the rows of a whole write batch (tens of requests) are freed at once and the next
    requests need as many files, hence a budget in bytes rather than a handful of files."""

    def __init__(self, keep_total: int = KEEP_TOTAL) -> None:
        self._keep_total = keep_total  # bytes of files kept at most (they live in shared memory)
        self._free: list[tuple[str, int]] = []
        self._bytes = 0
        self._written_before = 0  # ``clear(...)``: a file given back that was last written before this goes
        # re-entrant: a collection that frees rows (and so calls ``give``) can run inside any method
        self._lock = threading.RLock()

    def take(self) -> str | None:
        with self._lock:
            if not self._free:
                return None
            path, size = self._free.pop()
            self._bytes -= size
        return path

    def give(self, path: str, size: int) -> None:
        with self._lock:
            keep = size <= _KEEP_BYTES and self._bytes + size <= self._keep_total
            if keep and self._written_before:
                try:
                    keep = os.stat(path).st_mtime_ns >= self._written_before
                except OSError:
                    keep = False
            if keep:
                self._free.append((path, size))
                self._bytes += size
        if not keep:
            _unlink(path)

    def paths(self) -> list[str]:
        """The files kept (for tests and checks)."""
        with self._lock:
            return [path for path, _ in self._free]

    def clear(self, written_before: int = 0) -> None:
        """Remove the files kept; with ``written_before`` (ns since the epoch) also every file given back
        later that was last written before it (an erasure: files in use then still hold earlier bodies)."""
        with self._lock:
            free, self._free, self._bytes = self._free, [], 0
            self._written_before = max(self._written_before, written_before)
        for path, _ in free:
            _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _open_for_write(folder: str, reuse: str | None) -> tuple[int, str]:
    """A file to write from its start: ``reuse`` or a new one (``_write_all`` cuts a reused file to what
    it writes, so no file holds the tail of an earlier, longer body)."""
    if reuse is not None:
        try:
            return os.open(reuse, os.O_WRONLY), reuse
        except FileNotFoundError:  # its folder went with an earlier pool
            pass
    return tempfile.mkstemp(dir=folder)


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)
    if os.fstat(fd).st_size > offset:
        os.ftruncate(fd, offset)  # a reused file: its old tail would keep an earlier request's content


def put_body(folder: str, body: bytes, reuse: str | None = None) -> str:
    """Write a request body into ``reuse`` or a new file; returns the file's name."""
    fd, path = _open_for_write(folder, reuse)
    try:
        _write_all(fd, body)
    finally:
        os.close(fd)
    return path


def take_body(path: str, size: int) -> bytes:
    """Read the ``size`` bytes of a body written by ``put_body`` (the file stays: the writer owns it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        offset = 0
        while offset < size:
            chunk = os.pread(fd, size - offset, offset)
            if not chunk:
                raise EOFError(f"spool body {path} is shorter than {size} bytes")
            parts.append(chunk)
            offset += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


@dataclass
class SpooledTables:
    """Where the Arrow IPC streams of one ``rows.Tables`` are: a file and (offset, length) per table."""

    path: str
    streams: dict[str, tuple[int, int]]
    in_batch_duplicates: int


def put_tables(folder: str, tables: Any, reuse: str | None = None) -> SpooledTables:
    """Write the tables of a ``rows.Tables`` as Arrow IPC streams into ``reuse`` or a new file."""
    sink = pa.BufferOutputStream()
    streams: dict[str, tuple[int, int]] = {}
    for name, table in tables.as_dict().items():
        start = sink.tell()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        streams[name] = (start, sink.tell() - start)
    fd, path = _open_for_write(folder, reuse)
    try:
        _write_all(fd, sink.getvalue())
    finally:
        os.close(fd)
    return SpooledTables(path, streams, tables.in_batch_duplicates)


class _Mapping(mmap.mmap):
    """A read-only mapping of a rows file (a subclass, for the weak reference that returns the file
    to its recycler once no Arrow buffer uses the mapping any more)."""


def take_tables(ref: SpooledTables, recycler: Recycler | None = None) -> Any:
    """Map the file of ``put_tables`` (no copy) and return the ``rows.Tables``; the file goes back to
    ``recycler`` when the rows are freed (or is unlinked at once without one)."""
    from otel_agenttape.store import rows

    with open(ref.path, "rb") as fh:
        mapping = _Mapping(fh.fileno(), 0, access=mmap.ACCESS_READ)
    if recycler is None:
        os.unlink(ref.path)  # the mapping stays valid
    else:
        weakref.finalize(mapping, recycler.give, ref.path, len(mapping))
    buf = pa.py_buffer(mapping)
    del mapping  # the buffer (and the rows sliced from it) keep it alive
    t = {name: pa.ipc.open_stream(buf.slice(off, n)).read_all() for name, (off, n) in ref.streams.items()}
    return rows.Tables(spans=t["spans"], span_events=t["span_events"], span_links=t["span_links"],
                       resources=t["resources"], log_records=t["log_records"],
                       in_batch_duplicates=ref.in_batch_duplicates)
