"""`agenttape serve` serves the console on its HTTP port: the page at `/`, the read API under `/api/`,
over the store it writes, behind its token; it refuses a non-loopback address without one."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
from receiver_util import PB, free_env, trace_request


def _serve(db: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", db, "--http-port", "0", "--grpc-port", "0",
         "--json", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=free_env(),
    )
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"serve did not start: {proc.stderr.read()}")
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def _runs(c: httpx.Client, url: str, **headers: str) -> httpx.Response:
    return c.get(f"{url}/api/runs", headers=headers)


def test_serve_mounts_the_console_over_the_store_it_writes(tmp_path) -> None:
    proc, info = _serve(str(tmp_path / "s.duckdb"))
    try:
        with httpx.Client(timeout=30) as c:
            page = c.get(info["url"] + "/")
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            assert "<script" in page.text and "agenttape" in page.text
            assert _runs(c, info["url"]).json()["total"] == 0
            req = trace_request(3, attrs={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m-1"})
            assert c.post(info["url"] + "/v1/traces", content=req.SerializeToString(), headers=PB).status_code == 200
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                body = _runs(c, info["url"]).json()
                if body["total"]:
                    break
                time.sleep(0.2)
            assert body["total"] == 1, body
            assert c.get(info["url"] + "/healthz").status_code == 200  # the receiver's own routes still answer
            assert c.get(info["url"] + "/v1/traces").status_code == 405
    finally:
        _stop(proc)


def test_serve_console_needs_the_token_and_no_console_turns_it_off(tmp_path) -> None:
    proc, info = _serve(str(tmp_path / "t.duckdb"), "--token", "s3cret")
    try:
        with httpx.Client(timeout=30) as c:
            assert _runs(c, info["url"]).status_code == 401
            assert _runs(c, info["url"], Authorization="Bearer wrong").status_code == 401
            ok = _runs(c, info["url"], Authorization="Bearer s3cret")
            assert ok.status_code == 200 and ok.json()["total"] == 0
    finally:
        _stop(proc)
    proc, info = _serve(str(tmp_path / "u.duckdb"), "--no-console")
    try:
        with httpx.Client(timeout=30) as c:
            assert c.get(info["url"] + "/").status_code == 404
            assert _runs(c, info["url"]).status_code == 404
    finally:
        _stop(proc)


def test_serve_refuses_a_public_address_without_a_token(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", str(tmp_path / "p.duckdb"),
         "--host", "0.0.0.0", "--http-port", "0", "--grpc-port", "0"],
        capture_output=True, text=True, env=free_env(), timeout=60,
    )
    assert proc.returncode == 2
    assert "without a token" in proc.stderr and "--insecure-no-auth" in proc.stderr
