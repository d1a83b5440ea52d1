"""`agenttape serve` that stops at one moment of its work, so a test can `kill -9` it exactly there.

``FAULT_AT`` names the moment:

- ``wal``: inside a write-ahead log append: half of a group commit's bytes are written, not fsync'd;
- ``insert``: inside a store write: the batch's rows are inserted, its transaction not committed;
- ``checkpoint``: inside a DuckDB checkpoint (after a committed write, with the store lock held).

The moment first passes ``FAULT_AFTER`` times (so the store holds data), then the file ``FAULT_MARK``
is written and the thread stops there (for ``checkpoint``: ``FAULT_MARK.done`` once it finished).
Run as ``python tests/fault_serve.py serve --db ...``.
"""

from __future__ import annotations

import os
import sys
import threading
import time

_AT = os.environ["FAULT_AT"]
_AFTER = int(os.environ.get("FAULT_AFTER", "3"))
_MARK = os.environ["FAULT_MARK"]
_seen = [0]


def _reached(thread: str) -> bool:
    if threading.current_thread().name != thread:
        return False
    _seen[0] += 1
    return _seen[0] > _AFTER


def _mark(suffix: str = "") -> None:
    with open(_MARK + suffix, "w", encoding="ascii") as fh:
        fh.write(str(os.getpid()))


def _hold() -> None:
    _mark()
    while True:
        time.sleep(3600)


if _AT == "wal":
    _writev = os.writev

    def _torn_writev(fd: int, buffers: list) -> int:
        if _reached("agenttape-wal"):
            data = b"".join(bytes(b) for b in buffers)
            os.write(fd, data[: len(data) // 2])
            _hold()
        return _writev(fd, buffers)

    os.writev = _torn_writev
elif _AT == "insert":
    from otel_agenttape.store import writer

    _insert = writer.Store._insert

    def _insert_then_stop(self, con, t):  # noqa: ANN001, ANN202 - same signature as Store._insert
        out = _insert(self, con, t)
        if out.spans_stored and _reached("agenttape-writer"):
            _hold()
        return out

    writer.Store._insert = _insert_then_stop
elif _AT == "checkpoint":
    from otel_agenttape.store import writer

    _write_tables = writer.Store.write_tables

    def _write_then_checkpoint(self, t):  # noqa: ANN001, ANN202 - same signature as Store.write_tables
        out = _write_tables(self, t)
        if _reached("agenttape-writer"):
            with self._lock:
                _mark()
                self.con.execute("FORCE CHECKPOINT")
                _mark(".done")
        return out

    writer.Store.write_tables = _write_then_checkpoint
else:
    raise SystemExit(f"unknown FAULT_AT {_AT!r}")

if __name__ == "__main__":
    from otel_agenttape.cli import main

    sys.exit(main(sys.argv[1:]))
