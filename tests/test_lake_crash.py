"""A receiver killed with kill -9 while it publishes leaves the lake consistent (no partial file is
listed, nothing twice) and publishes the rest after a restart on the same DuckDB file."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from receiver_util import PB, trace_request  # noqa: E402
from test_lake_receivers import Receiver  # noqa: E402

from otel_agenttape.store.lake import lake_fs, load_catalog  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402

REQUESTS = 60
SPANS_PER_REQUEST = 1000


def _lake_state(uri: str) -> dict[str, Any]:
    reader = open_reader([uri])
    try:
        n, distinct = reader.query("SELECT count(*), count(DISTINCT trace_id || span_id) FROM spans").to_pylist()[0].values()
        problems = reader.lakes.check_files()
    finally:
        reader.close()
    return {"spans": n, "distinct": distinct, "problems": problems}


def _in_flight(root: str) -> bool:
    """A publication is under way: a staged (hidden ``.tmp``) file is in the lake."""
    return any(n.startswith(".") and n.endswith(".tmp") for _, _, names in os.walk(root) for n in names)


def _pending(db: str) -> int:
    import duckdb

    con = duckdb.connect(db, read_only=True)
    try:
        return con.sql("SELECT count(*) FROM lake_publications WHERE state = 'pending'").fetchall()[0][0]
    finally:
        con.close()


def _feed_and_kill(rec: Receiver, root: str, client: httpx.Client, start: int) -> int:
    """Send spans until the receiver is caught publishing, then SIGKILL it; returns the spans sent."""
    sent = 0
    for i in range(REQUESTS):
        body = trace_request(SPANS_PER_REQUEST, attrs={"payload": "x" * 200, "i": start + i}).SerializeToString()
        assert client.post(f"{rec.url}/v1/traces", content=body, headers=PB).status_code == 200
        sent += SPANS_PER_REQUEST
        if sent >= 8000:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not _in_flight(root):
                time.sleep(0.0005)
            if _in_flight(root):
                rec.kill()  # SIGKILL, mid-publication
                return sent
    rec.stop()
    raise AssertionError("never caught the receiver publishing")


def test_kill_9_mid_publish_then_restart(tmp_path: Any) -> None:
    root = str(tmp_path / "lake")
    db = str(tmp_path / "r0.duckdb")
    sent = 0
    caught_pending = 0
    with httpx.Client(timeout=30) as client:
        for cycle in range(4):
            rec = Receiver(db, root, "r0", dict(os.environ), interval=0.05, max_spans=4000).start()
            sent += _feed_and_kill(rec, root, client, cycle * REQUESTS)
            # what the lake lists right after the crash is whole and unique
            state = _lake_state(root)
            assert state["problems"] == []
            assert state["spans"] == state["distinct"] < sent
            pending = _pending(db)  # a batch between its cursor record and being marked published
            assert pending <= 1
            caught_pending += pending
            if caught_pending >= 2:
                break
    assert caught_pending >= 1, "no kill landed while a batch was pending"
    # restart on the same DuckDB file: the pending batch is published again under the same names
    rec = Receiver(db, root, "r0", dict(os.environ), interval=0.05, max_spans=4000).start()
    rec.stop()
    state = _lake_state(root)
    assert state["problems"] == []
    assert state["spans"] == state["distinct"] == sent
    assert _pending(db) == 0
    seqs = sorted(int(k.rsplit("/", 1)[1].split(".")[0]) for k in load_catalog(lake_fs(root)).entries)
    assert seqs == list(range(1, len(seqs) + 1))  # one entry per batch, none skipped or repeated
