"""``agenttape lake compact`` while three receivers keep publishing into the lake (a folder, and an S3
server on 127.0.0.1 with moto): every row they received is in the lake exactly once afterwards, and
``verify`` passes."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from typing import Any

import duckdb
import httpx
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from receiver_util import PB, trace_request  # noqa: E402
from test_lake_receivers import RECEIVERS, Receiver, _make_bucket, _s3_env, moto_endpoint, record  # noqa: E402, F401

from otel_agenttape.store.lake import lake_fs, load_catalog  # noqa: E402
from otel_agenttape.store.reader import open_reader  # noqa: E402

COMPACTIONS = 3
SPANS_PER_REQUEST = 200
KEYS = "SELECT trace_id, span_id FROM spans"


@pytest.fixture(params=["folder", "s3"])
def live_lake(request: Any, tmp_path: Any, monkeypatch: Any) -> dict[str, Any]:
    env = dict(os.environ)
    if request.param == "folder":
        return {"uri": str(tmp_path / "lake"), "env": env}
    endpoint = request.getfixturevalue("moto_endpoint")
    bucket = f"live-{secrets.token_hex(4)}"
    _make_bucket(endpoint, bucket)
    for k, v in _s3_env(endpoint).items():
        monkeypatch.setenv(k, v)  # this process and the compaction read the lake too
    env.update(_s3_env(endpoint))
    return {"uri": f"s3://{bucket}/team-b", "env": env}


class Feeder(threading.Thread):
    """Sends traces of plain spans, each to one receiver by its trace id, until stopped."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.stop = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=30) as client:
                i = 0
                while not self.stop.is_set():
                    tid = secrets.token_bytes(16)
                    body = trace_request(SPANS_PER_REQUEST, trace_id=tid, attrs={"payload": "y" * 100, "i": i})
                    url = self.urls[int.from_bytes(tid, "big") % len(self.urls)]
                    r = client.post(f"{url}/v1/traces", content=body.SerializeToString(), headers=PB)
                    assert r.status_code == 200, r.text
                    self.sent += SPANS_PER_REQUEST
                    i += 1
                    time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def _published(uri: str) -> dict[str, int]:
    return load_catalog(lake_fs(uri)).receivers()


def _compact(uri: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "otel_agenttape", "lake", "compact", uri, "--grace", "0", "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _lake_rows(uri: str) -> dict[str, Any]:
    reader = open_reader([uri])
    try:
        keys = reader.query(KEYS).to_pylist()
        counts = {t: reader.query(f"SELECT count(*) AS n FROM {t}").to_pylist()[0]["n"]
                  for t in ("span_events", "span_links", "log_records")}
        problems = reader.lakes.check_files()
    finally:
        reader.close()
    return {"keys": [(k["trace_id"], k["span_id"]) for k in keys], "counts": counts, "problems": problems}


def _store_rows(dbs: list[str]) -> dict[str, Any]:
    keys: list[tuple[str, str]] = []
    counts = {"span_events": 0, "span_links": 0, "log_records": 0}
    for db in dbs:
        con = duckdb.connect(db, read_only=True)
        try:
            keys += [(str(t), str(s)) for t, s in con.sql(KEYS).fetchall()]
            for t in counts:
                counts[t] += con.sql(f"SELECT count(*) FROM {t}").fetchall()[0][0]
        finally:
            con.close()
    return {"keys": keys, "counts": counts}


def test_compact_while_receivers_publish(live_lake: dict[str, Any], tmp_path: Any) -> None:
    uri, env = live_lake["uri"], live_lake["env"]
    dbs = [str(tmp_path / f"r{i}.duckdb") for i in range(RECEIVERS)]
    receivers = [Receiver(db, uri, f"r{i}", env, interval=0.05, max_spans=1500).start() for i, db in enumerate(dbs)]
    feeder = Feeder([r.url for r in receivers])
    overlapped = 0  # compactions during which receivers published new batches, and that merged files
    try:
        sealed = record([r.url for r in receivers])  # sealed tapes for verify, spread over the receivers
        feeder.start()
        for _ in range(COMPACTIONS):
            deadline = time.monotonic() + 60
            while sum(_published(uri).values()) < 3 * RECEIVERS and time.monotonic() < deadline:
                time.sleep(0.1)
            before = _published(uri)
            done = _compact(uri, env)
            after = _published(uri)
            if done["merged_files"] > 0 and any(after.get(k, 0) > v for k, v in before.items()):
                overlapped += 1
            assert feeder.error is None and feeder.is_alive()
    finally:
        feeder.stop.set()
        feeder.join(60)
        for r in receivers:
            r.stop()  # a clean stop publishes everything stored
    assert feeder.error is None, feeder.error
    assert feeder.sent > 0
    assert overlapped >= 1, f"only {overlapped} compactions merged files while receivers published"
    lake, stores = _lake_rows(uri), _store_rows(dbs)
    assert lake["problems"] == []
    assert len(lake["keys"]) == len(set(lake["keys"])), "a row is in the lake twice"
    assert sorted(lake["keys"]) == sorted(stores["keys"]), "the lake holds other rows than the receivers received"
    assert len(stores["keys"]) >= feeder.sent
    assert lake["counts"] == stores["counts"]
    # compacting the quiet lake once more keeps the same rows, and every sealed tape still verifies
    _compact(uri, env)
    assert sorted(_lake_rows(uri)["keys"]) == sorted(stores["keys"])
    proc = subprocess.run([sys.executable, "-m", "otel_agenttape", "verify", "--lake", uri, "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["valid"], proc.stdout[-2000:]
    assert len(doc["chains"]) >= 1 + len(sealed["children"]) + len(sealed["solos"])
    assert doc["lake_files"]["problems"] == []
