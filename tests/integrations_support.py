"""A real ``agenttape serve`` process on 127.0.0.1 for the framework tests, and the CLI read back."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from otel_agenttape.cli import main
from receiver_util import free_env


@dataclass
class Served:
    proc: subprocess.Popen
    url: str
    db: str

    def wait_stored(self, at_least: int = 1, timeout: float = 30.0) -> int:
        """Wait until every span the server accepted is stored (and at least ``at_least`` are)."""
        deadline = time.monotonic() + timeout
        while True:
            text = httpx.get(f"{self.url}/metrics", timeout=10).text
            accepted = _metric(text, "agenttape_spans_accepted_total")
            stored = _metric(text, "agenttape_spans_stored_total") + _metric(text, "agenttape_spans_duplicate_total")
            if accepted >= at_least and stored >= accepted:
                return int(stored)
            if time.monotonic() > deadline:
                raise AssertionError(f"receiver stored {stored} of {accepted} spans")
            time.sleep(0.1)


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


@contextlib.contextmanager
def serve(db: str) -> Iterator[Served]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", db, "--http-port", "0", "--grpc-port", "0",
         "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=free_env())
    try:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"serve did not start: {proc.stderr.read()}")
        yield Served(proc, json.loads(line)["url"], db)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def cli(capsys: Any, *args: str) -> tuple[int, str]:
    """Run one ``agenttape`` command in this process; its exit code and what it printed."""
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().out


def cli_json(capsys: Any, *args: str) -> Any:
    code, out = cli(capsys, *args, "--json")
    assert code == 0, out
    return json.loads(out)


def tree_runs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every run of a ``replay --tree --json`` document, depth first."""
    yield doc
    for child in doc.get("children") or []:
        yield from tree_runs(child)
