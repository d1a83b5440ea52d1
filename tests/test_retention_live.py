"""Retention and reads while a running receiver rewrites its store (docs/integrity.md "Retention",
docs/operations.md): ``retain`` goes to the receiver (``POST /api/retain``, token-gated), requests sent
meanwhile are acknowledged into the WAL and stored after, only the old spans go, and ``verify`` tells the
retention from tampering; a read that arrives during a rewrite waits for it (bounded) instead of failing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import orjson
import pytest
from integrity_support import encode
from test_erasure_live import Ingest, _post
from test_retention_store import KEY, NEW_TEXT, OLD_TEXT, _spans

import otel_agenttape
from otel_agenttape.console.serve import receiver_app
from otel_agenttape.receiver.server import TapeServer
from otel_agenttape.tape.verification import verify_store

TOKEN = "retain-live-token"


def _get(url: str, token: str | None = TOKEN) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _query(url: str, sql: str) -> tuple[int, bytes]:
    return _status_body(url + "/api/query", orjson.dumps({"sql": sql}))


def _status_body(url: str, body: bytes, token: str | None = TOKEN) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("retain-live") / "live.duckdb")
    server = TapeServer(db, http_port=0, grpc_enabled=False, ingest_workers=0, token=TOKEN,
                        http_fallback=receiver_app(lambda: server.store, TOKEN)).start()
    try:
        assert _post(server.url, encode(_spans()).SerializeToString(), token=TOKEN) == 200
        assert server.pipeline.wait_idle(30)
        reads: list[int] = []
        stop = threading.Event()
        ingest = Ingest(server.url, token=TOKEN)
        acked = ingest.acked

        def read() -> None:  # the console's runs page and /api/query, all through the rewrite
            while not stop.is_set():
                reads.append(_get(server.url + "/api/runs")[0])
                reads.append(_query(server.url, "SELECT count(*) FROM spans")[0])

        reader_thread = threading.Thread(target=read)
        ingest.start()
        reader_thread.start()
        time.sleep(0.3)
        before = len(acked)
        waited_before = server.store.gate.waited_reads
        with otel_agenttape.open(db) as tapes:
            assert tapes.reader.kind == "server"
            dry = tapes.retain(older_than_days=30, reason="keep 30 days", dry_run=True)
            done = tapes.retain(older_than_days=30, reason="keep 30 days")
        during = len(acked) - before
        time.sleep(0.3)
        stop.set()
        ingest.stop()
        reader_thread.join(60)
        assert server.pipeline.wait_idle(60)
        reader = server.store.reader()
        try:
            stored = set(reader.query("SELECT span_id FROM spans WHERE name LIKE 'load %'").column(0).to_pylist())
            texts = reader.query("SELECT coalesce(string_agg(attributes, ''), '') AS t FROM spans").column(0)[0].as_py()
            reports = {r.chain_id: r for r in verify_store(reader, verifiers=[KEY.verifier()])}
            retention = reader.query("SELECT record FROM store_retention").column(0).to_pylist()
        finally:
            reader.close()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        cli = subprocess.run([sys.executable, "-m", "otel_agenttape", "retain", "--db", db, "--older-than", "30d",
                              "--reason", "policy"], capture_output=True, text=True, timeout=120, env=env)
        wrong = _status_body(server.url + "/api/retain", orjson.dumps({"older_than_days": 30, "reason": "x"}),
                             token="wrong")[0]
        yield {"dry": dry, "done": done, "acked": acked, "stored": stored, "during": during, "texts": texts,
               "reports": reports, "retention": retention, "reads": reads, "cli": cli, "wrong": wrong,
               "waited": server.store.gate.waited_reads - waited_before}
    finally:
        server.stop()


def test_retain_through_the_receiver_drops_only_the_old_spans(live) -> None:
    dry, done = live["dry"], live["done"]
    assert dry["dry_run"] and (dry["spans"], dry["chains"]) == (done["spans"], done["chains"]) == (6, 2)
    assert done["writes_paused_seconds"] < 30
    assert OLD_TEXT not in live["texts"] and NEW_TEXT in live["texts"]
    assert len(live["retention"]) == 1 and orjson.loads(live["retention"][0])["spans"] == 6


def test_every_span_sent_while_retain_runs_is_stored(live) -> None:
    assert len(live["acked"]) > 100 and live["during"] > 0, (len(live["acked"]), live["during"])
    missing = set(live["acked"]) - live["stored"]
    assert not missing, f"{len(missing)} acknowledged spans lost"


def test_verify_tells_the_retention_from_tampering(live) -> None:
    reports = live["reports"]
    assert all(r.valid for r in reports.values()), {k: r.reason for k, r in reports.items()}
    assert "mixed" in reports  # its old entries are recorded as removed; the entry left links to their head


def test_reads_during_the_rewrite_wait_and_succeed(live) -> None:
    reads = live["reads"]
    assert len(reads) > 10 and set(reads) == {200}, sorted(set(reads))


def test_the_cli_goes_through_the_receiver_and_the_route_needs_the_token(live) -> None:
    cli = live["cli"]
    assert cli.returncode == 0, cli.stderr
    assert "removed 0 spans and 0 log records dated before" in cli.stdout
    assert "done by the running receiver: its writes waited" in cli.stdout
    assert live["wrong"] == 401


def test_a_read_waits_for_a_rewrite_then_a_bounded_wait_answers_503(tmp_path) -> None:
    db = str(tmp_path / "gate.duckdb")
    server = TapeServer(db, http_port=0, grpc_enabled=False, ingest_workers=0, token=TOKEN,
                        http_fallback=receiver_app(lambda: server.store, TOKEN)).start()
    try:
        assert _post(server.url, encode(_spans()).SerializeToString(), token=TOKEN) == 200
        assert server.pipeline.wait_idle(30)
        assert _get(server.url + "/api/runs")[0] == 200  # the console's reader is open before the rewrite
        started = threading.Event()

        def slow_rewrite(path: str) -> None:
            started.set()
            time.sleep(1.5)  # as long as a big file takes to copy

        t = threading.Thread(target=server.store.exclusive, args=(slow_rewrite,))
        t.start()
        assert started.wait(10)
        t0 = time.monotonic()
        status, body = _query(server.url, "SELECT count(*) AS n FROM spans")
        runs = _get(server.url + "/api/runs")
        waited = time.monotonic() - t0
        t.join(30)
        assert status == 200 and runs[0] == 200, (status, body, runs)
        assert waited >= 1.0 and server.store.gate.waited_reads >= 1
        assert orjson.loads(runs[1])["runs"], runs[1][:200]  # the console's reader reads the reopened file
        server.store.gate.wait_seconds = 0.2  # past the bound: 503, retry later
        started.clear()
        t = threading.Thread(target=server.store.exclusive, args=(slow_rewrite,))
        t.start()
        assert started.wait(10)
        busy, body = _query(server.url, "SELECT 1")
        console = _get(server.url + "/api/runs")[0]
        t.join(30)
        assert busy == 503 and b"being rewritten" in body and console == 503
        assert _query(server.url, "SELECT 1")[0] == 200
    finally:
        server.stop()
