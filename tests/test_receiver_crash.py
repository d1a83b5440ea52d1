"""Durable before acknowledged: `kill -9` the `agenttape serve` process right after a 200, restart it,
and every acknowledged span is in the store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
from receiver_util import PB, free_env, span_keys, trace_request

from otel_agenttape.receiver.server import discovery_path


def _serve(db: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", db, "--http-port", "0", "--grpc-port", "0",
         "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=free_env(),
    )
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"serve did not start: {proc.stderr.read()}")
    return proc, json.loads(line)


def test_kill_9_after_ack_then_restart_keeps_every_acknowledged_span(tmp_path):
    db = str(tmp_path / "crash.duckdb")
    proc, info = _serve(db)
    acked: set[tuple[str, str]] = set()
    try:
        with httpx.Client(timeout=30) as c:
            assert c.get(f"{info['url']}/healthz").status_code == 200
            for _ in range(40):  # faster than the store writes: part of it is only in the WAL
                req = trace_request(150, attrs={"gen_ai.input.messages": "m" * 600})
                r = c.post(f"{info['url']}/v1/traces", content=req.SerializeToString(), headers=PB)
                assert r.status_code == 200
                acked |= span_keys(req)
        os.kill(proc.pid, signal.SIGKILL)  # right after the last 200
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert discovery_path(db).exists()  # a killed server leaves it behind; the next one replaces it

    proc, info = _serve(db)
    print("WAL records replayed at restart:", info["replayed"])
    try:
        with httpx.Client(timeout=30) as c:
            assert c.get(f"{info['url']}/healthz").status_code == 200
            r = c.post(f"{info['url']}/api/query", json={"sql": "SELECT trace_id, span_id FROM spans"})
            assert r.status_code == 200, r.text
            import pyarrow as pa

            t = pa.ipc.open_stream(r.content).read_all()
            stored = set(zip(t.column("trace_id").to_pylist(), t.column("span_id").to_pylist()))
            assert stored == acked
            assert t.num_rows == len(acked)  # replay after a partial apply stores each span once
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0
    assert not discovery_path(db).exists()
    # after a clean stop the file opens read-only and nothing is left in the WAL
    from otel_agenttape.store.reader import open_reader

    with open_reader(db) as reader:
        assert reader.query("SELECT count(*) FROM spans").column(0)[0].as_py() == len(acked)
    assert not any((tmp_path / "crash.duckdb.otlpwal").glob("*.wal"))


def test_serve_refuses_a_db_held_by_a_live_server(tmp_path):
    db = str(tmp_path / "held.duckdb")
    proc, _ = _serve(db)
    try:
        out = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", db, "--http-port", "0",
                              "--grpc-port", "0"], capture_output=True, text=True, env=free_env(), timeout=60)
        assert out.returncode == 2 and "already served" in out.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
