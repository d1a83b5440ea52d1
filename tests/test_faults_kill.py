"""`kill -9` of a receiver under load at three moments of its work, then a restart: every acknowledged
span is stored exactly once. (The moment right after an acknowledgement is in test_receiver_crash.py.)

Four client threads post continuously; the server (``fault_serve.py``) stops at the chosen moment and
the test kills it there: in the middle of a write-ahead log append (a torn record on disk), inside a
store write whose transaction is not committed, and inside a DuckDB checkpoint."""

from __future__ import annotations

import collections
import os
import signal
import threading
from pathlib import Path

import httpx
import pytest
from faults_util import serve, stop, stored_keys, wait_for
from receiver_util import PB, free_env, span_keys, trace_request

HERE = Path(__file__).parent


def _load(url: str, acked: set, lock: threading.Lock, done: threading.Event) -> None:
    with httpx.Client(timeout=10) as c:
        while not done.is_set():
            req = trace_request(30, attrs={"gen_ai.input.messages": "m" * 1500})
            try:
                r = c.post(f"{url}/v1/traces", content=req.SerializeToString(), headers=PB)
            except httpx.HTTPError:
                continue  # the server is gone: this request was not acknowledged
            if r.status_code == 200:
                with lock:
                    acked.update(span_keys(req))


def _kill_at(tmp_path: Path, moment: str, after: int) -> tuple[str, set, bool]:
    """Run the load against a server that stops at ``moment``; kill -9 it there. Returns the store,
    the acknowledged span keys, and whether the kill came while the moment lasted."""
    db = str(tmp_path / f"{moment}.duckdb")
    mark = tmp_path / f"{moment}.mark"
    env = {**free_env(), "FAULT_AT": moment, "FAULT_AFTER": str(after), "FAULT_MARK": str(mark)}
    proc, info = serve(db, "--ingest-workers", "0", env=env, entry=[str(HERE / "fault_serve.py")])
    acked: set = set()
    lock = threading.Lock()
    done = threading.Event()
    senders = [threading.Thread(target=_load, args=(info["url"], acked, lock, done)) for _ in range(4)]
    try:
        for t in senders:
            t.start()
        assert wait_for(mark.exists, 120, 0.002), f"the server never reached {moment}"
        os.kill(proc.pid, signal.SIGKILL)
        during = not Path(str(mark) + ".done").exists()
        proc.wait(10)
    finally:
        done.set()
        for t in senders:
            t.join(30)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return db, acked, during


@pytest.mark.parametrize("moment,after", [("wal", 40), ("insert", 8), ("checkpoint", 12)])
def test_kill_9_under_load_then_restart_stores_every_acknowledged_span_once(tmp_path, moment, after):
    for attempt in range(3):  # a checkpoint may end before the kill lands: try again
        where = tmp_path / f"try{attempt}"
        where.mkdir()
        db, acked, during = _kill_at(where, moment, after)
        if during:
            break
    assert during, f"the kill never landed inside {moment}"
    assert len(acked) > 100
    proc, info = serve(db, "--ingest-workers", "0")
    try:
        assert info["replayed"] > 0  # the write-ahead log held what the store did not
        rows = stored_keys(info["url"])
        counts = collections.Counter(rows)
        assert not [k for k, n in counts.items() if n > 1]  # nothing stored twice
        assert acked <= set(counts)  # every acknowledged span is there
    finally:
        code, err = stop(proc)
    assert code == 0, err
