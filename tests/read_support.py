"""A real ``agenttape serve`` process on 127.0.0.1 (ephemeral ports) for the read-model tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


class Served:
    """``agenttape serve --db DB`` in a child process; readers reach it through its discovery file."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", db, "--host", "127.0.0.1",
             "--http-port", "0", "--grpc-port", "0", "--ingest-workers", "0", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"agenttape serve did not start: {err[-2000:]}")
        self.url = json.loads(line)["url"]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}

    def script(self, *args: str, timeout: float = 180) -> str:
        proc = subprocess.run([sys.executable, *args], env=self.env(), capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def wait_for(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll until ``check()`` is truthy (the server stores what it acked a moment later)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)
