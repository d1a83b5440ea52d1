"""Hand-off of request bodies and Arrow rows between the receiver and its converter processes.

A pipe between processes costs a pickle, many small reads and writes and a copy on each side; at tens
of thousands of spans per second that is several microseconds of the main process per span. Instead,
bodies and rows go through files in a private folder in shared memory (``/dev/shm`` when there is
one): a body is one write and one read, and the rows come back as Arrow IPC streams that the main
process maps without copying. Each file is unlinked as soon as it is read (a mapping stays valid after
that); folders left by a killed server are removed when the next pool starts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

_PREFIX = "agenttape-spool-"
_SHM = "/dev/shm"
_WRITE_BUFFER = 1 << 20


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


def create() -> str:
    """A new spool folder for this process (and remove those of processes that are gone)."""
    base = _base()
    for path in Path(base).glob(_PREFIX + "*"):
        try:
            pid = int(path.name[len(_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)


def remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _new_file(folder: str) -> tuple[int, str]:
    return tempfile.mkstemp(dir=folder)


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def put_body(folder: str, body: bytes) -> str:
    """Write a request body; returns its file name (the reader unlinks it)."""
    fd, path = _new_file(folder)
    try:
        _write_all(fd, body)
    finally:
        os.close(fd)
    return path


def take_body(path: str) -> bytes:
    """Read and unlink a body written by ``put_body``."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)


@dataclass
class SpooledTables:
    """Where the Arrow IPC streams of one ``rows.Tables`` are: a file and (offset, length) per table."""

    path: str
    streams: dict[str, tuple[int, int]]
    in_batch_duplicates: int


def put_tables(folder: str, tables: Any) -> SpooledTables:
    """Write the tables of a ``rows.Tables`` as Arrow IPC streams into one file."""
    fd, path = _new_file(folder)
    os.close(fd)
    streams: dict[str, tuple[int, int]] = {}
    with pa.BufferedOutputStream(pa.OSFile(path, "wb"), buffer_size=_WRITE_BUFFER) as sink:
        for name, table in tables.as_dict().items():
            start = sink.tell()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            streams[name] = (start, sink.tell() - start)
    return SpooledTables(path, streams, tables.in_batch_duplicates)


def take_tables(ref: SpooledTables) -> Any:
    """Map the file of ``put_tables`` (no copy), unlink it, and return the ``rows.Tables``."""
    from otel_agenttape.store import rows

    try:
        buf = pa.memory_map(ref.path).read_buffer()
    finally:
        os.unlink(ref.path)
    t = {name: pa.ipc.open_stream(buf.slice(off, n)).read_all() for name, (off, n) in ref.streams.items()}
    return rows.Tables(spans=t["spans"], span_events=t["span_events"], span_links=t["span_links"],
                       resources=t["resources"], log_records=t["log_records"],
                       in_batch_duplicates=ref.in_batch_duplicates)
