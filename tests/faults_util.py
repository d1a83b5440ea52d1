"""Helpers of the fault tests: a real `agenttape serve` process on 127.0.0.1, checksums, scrapes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from receiver_util import free_env


def sha256(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def serve(db: str, *extra: str, env: dict[str, str] | None = None,
          entry: list[str] | None = None) -> tuple[subprocess.Popen, dict[str, Any]]:
    """Start `agenttape serve --db DB` on free ports; returns the process and its startup line.
    ``entry`` replaces ``-m otel_agenttape.cli`` (a wrapper script that injects faults)."""
    proc = subprocess.Popen(
        [sys.executable, *(entry or ["-m", "otel_agenttape.cli"]), "serve", "--db", db, "--http-port", "0",
         "--grpc-port", "0", "--json", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or free_env(),
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        raise AssertionError(f"serve did not start: {proc.stderr.read()}")
    return proc, json.loads(line)


def stop(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    """SIGTERM, wait, and return (exit code, stderr)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    err = proc.stderr.read() if proc.stderr else ""
    return proc.returncode, err


def metric(text: str, name: str) -> float:
    """Sum of every series of one metric in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def stored_keys(url: str, token: str | None = None) -> list[tuple[str, str]]:
    """Every (trace_id, span_id) row in the served store, duplicates included."""
    import httpx
    import pyarrow as pa

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.post(f"{url}/api/query", json={"sql": "SELECT trace_id, span_id FROM spans"}, headers=headers,
                   timeout=60)
    assert r.status_code == 200, r.text
    t = pa.ipc.open_stream(r.content).read_all()
    return list(zip(t.column("trace_id").to_pylist(), t.column("span_id").to_pylist()))


def wait_for(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate()`` until it is true or ``timeout`` seconds passed."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
