"""The write-ahead log after a failed write: the failing group's appends raise, its partly written bytes
are cut off the segment, and the log keeps working once the disk has room again."""

from __future__ import annotations

import errno
import os
import time

import pytest

from otel_agenttape.receiver import wal as wal_mod
from otel_agenttape.receiver.wal import KIND_TRACES, WriteAheadLog, read_segment


def test_a_torn_group_is_cut_off_and_later_records_replay(tmp_path, monkeypatch):
    real = os.writev
    state = {"full": False, "calls": 0}

    def writev(fd, buffers):
        if state["full"]:
            state["calls"] += 1
            if state["calls"] == 1:  # the disk takes part of the group, then is full
                data = b"".join(bytes(b) for b in buffers)
                return os.write(fd, data[: len(data) // 3])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, buffers)

    monkeypatch.setattr(wal_mod.os, "writev", writev)
    monkeypatch.setattr(wal_mod, "_PROBE_SECONDS", 0.05)
    log = WriteAheadLog(tmp_path / "wal")
    try:
        log.append(KIND_TRACES, b"a" * 100)
        state["full"] = True
        with pytest.raises(OSError, match="No space left on device"):
            log.append(KIND_TRACES, b"b" * 5000)
        assert log.error is not None and log.write_errors == 1
        with pytest.raises(OSError, match="No space left on device"):
            log.append(KIND_TRACES, b"c" * 100)
        state["full"] = False  # space is back: the probe clears the error, appends work again
        for _ in range(100):
            if log.error is None:
                break
            time.sleep(0.05)
        assert log.error is None
        log.append(KIND_TRACES, b"d" * 100)
    finally:
        log.close()
    records = [p for seg in sorted((tmp_path / "wal").glob("*.wal")) for _, p in read_segment(seg)]
    assert records == [b"a" * 100, b"d" * 100]  # nothing torn between them, nothing refused kept
