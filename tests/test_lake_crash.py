"""A receiver killed with kill -9 while it publishes leaves the lake consistent (no partial file is
listed, nothing twice) and publishes the rest after a restart on the same DuckDB file; once into a
folder and once into an S3 server on 127.0.0.1 (moto in server mode)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import httpx
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from receiver_util import PB, trace_request  # noqa: E402
from test_lake_receivers import Receiver, _make_bucket, _s3_env, moto_endpoint  # noqa: E402, F401

from otel_agenttape.store.lake import lake_fs, load_catalog  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402

REQUESTS = 60
SPANS_PER_REQUEST = 1000


def _lake_state(uri: str) -> dict[str, Any]:
    if not load_catalog(lake_fs(uri)).listed:  # killed while publishing its first batch: nothing is listed
        return {"spans": 0, "distinct": 0, "problems": []}
    reader = open_reader([uri])
    try:
        n, distinct = reader.query("SELECT count(*), count(DISTINCT trace_id || span_id) FROM spans").to_pylist()[0].values()
        problems = reader.lakes.check_files()
    finally:
        reader.close()
    return {"spans": n, "distinct": distinct, "problems": problems}


def _staged(folder: str) -> set[str]:
    """The staged files in ``folder``: hidden ``.tmp`` files in a lake folder (renamed into place when
    whole), or the local files a receiver writes before uploading each one to S3."""
    return {os.path.join(d, n) for d, _, names in os.walk(folder) for n in names if n.endswith(".tmp")}


def _pending(db: str) -> int:
    import duckdb

    con = duckdb.connect(db, read_only=True)
    try:
        return con.sql("SELECT count(*) FROM lake_publications WHERE state = 'pending'").fetchall()[0][0]
    finally:
        con.close()


def _feed_and_kill(rec: Receiver, staging: str, client: httpx.Client, start: int) -> int:
    """Send spans until the receiver is caught publishing (a staged file that was not there before: an
    earlier kill leaves its own behind), then SIGKILL it; returns the spans sent."""
    stale = _staged(staging)
    sent = 0
    for i in range(REQUESTS):
        body = trace_request(SPANS_PER_REQUEST, attrs={"payload": "x" * 200, "i": start + i}).SerializeToString()
        assert client.post(f"{rec.url}/v1/traces", content=body, headers=PB).status_code == 200
        sent += SPANS_PER_REQUEST
        if sent >= 8000:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not _staged(staging) - stale:
                time.sleep(0.0005)
            if _staged(staging) - stale:
                rec.kill()  # SIGKILL, mid-publication
                return sent
    rec.stop()
    raise AssertionError("never caught the receiver publishing")


@pytest.fixture(params=["folder", "s3"])
def crash_lake(request: Any, tmp_path: Any, monkeypatch: Any) -> dict[str, Any]:
    """Where the receiver publishes, the environment it runs in and the folder its staged files appear in."""
    env = dict(os.environ)
    if request.param == "folder":
        root = str(tmp_path / "lake")
        return {"uri": root, "env": env, "staging": root}
    endpoint = request.getfixturevalue("moto_endpoint")
    bucket = f"crash-{os.urandom(4).hex()}"
    _make_bucket(endpoint, bucket)
    for k, v in _s3_env(endpoint).items():
        monkeypatch.setenv(k, v)  # this process reads the lake too
    env.update(_s3_env(endpoint))
    # a file is written beside the receiver's store (the test's r0.duckdb), then uploaded whole
    return {"uri": f"s3://{bucket}/lake", "env": env, "staging": str(tmp_path / "r0.duckdb.lake-staging")}


def test_kill_9_mid_publish_then_restart(crash_lake: dict[str, Any], tmp_path: Any) -> None:
    uri, env, staging = crash_lake["uri"], crash_lake["env"], crash_lake["staging"]
    db = str(tmp_path / "r0.duckdb")
    sent = 0
    caught_pending = 0
    with httpx.Client(timeout=30) as client:
        for cycle in range(4):
            rec = Receiver(db, uri, "r0", env, interval=0.05, max_spans=4000).start()
            sent += _feed_and_kill(rec, staging, client, cycle * REQUESTS)
            # what the lake lists right after the crash is whole and unique
            state = _lake_state(uri)
            assert state["problems"] == []
            assert state["spans"] == state["distinct"] < sent
            pending = _pending(db)  # a batch between its cursor record and being marked published
            assert pending <= 1
            caught_pending += pending
            if caught_pending >= 2:
                break
    assert caught_pending >= 1, "no kill landed while a batch was pending"
    assert _staged(staging), "the kills left staged files behind"
    # restart on the same DuckDB file: the pending batch is published again under the same names, and
    # the staged files the kills left are removed
    rec = Receiver(db, uri, "r0", env, interval=0.05, max_spans=4000).start()
    rec.stop()
    assert _staged(staging) == set()
    state = _lake_state(uri)
    assert state["problems"] == []
    assert state["spans"] == state["distinct"] == sent
    assert _pending(db) == 0
    seqs = sorted(int(k.rsplit("/", 1)[1].split(".")[0]) for k in load_catalog(lake_fs(uri)).entries)
    assert seqs == list(range(1, len(seqs) + 1))  # one entry per batch, none skipped or repeated
