"""What the console tests record and how they serve it: the demo, a wide fleet, deep nesting, hostile content.

Everything goes through the real capture API and OTLP exporter into a real receiver on 127.0.0.1: an
``agenttape serve`` process (``AgenttapeServe``), or the console app alone in a thread (``serve_console``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import otel_agenttape

XSS_TOOL_RESULT = '<img src="/xss-img" onerror="window.__xss = 1; fetch(\'/xss-onerror\')">'
XSS_SCRIPT = "<script>window.__xss = 2; fetch('/xss-script')</script>"
XSS_AGENT = '<b onmouseover="window.__xss=3">hostile</b>'
FLEET_CHILDREN = 50


def recorder(server: Any, service: str) -> Any:
    """A tape exporting to ``server`` (anything with ``url``, and ``token`` when it asks for one)."""
    token = getattr(server, "token", None)
    return otel_agenttape.setup(endpoint=server.url, protocol="http/protobuf", service_name=service,
                                headers={"authorization": f"Bearer {token}"} if token else None)


class AgenttapeServe:
    """``python -m otel_agenttape serve --db DB`` on free loopback ports (HTTP, gRPC), the console on its
    HTTP port; ``token`` gates the exports and the console alike."""

    def __init__(self, db: str | Path, token: str | None = None, log: str | Path | None = None,
                 annotate_token: str | None = None, env: dict[str, str] | None = None) -> None:
        self.db, self.token, self.annotate_token = str(db), token, annotate_token
        self.extra_env = dict(env or {})
        self.log = str(log or f"{db}.serve.log")
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> AgenttapeServe:
        cmd = [sys.executable, "-m", "otel_agenttape", "serve", "--db", self.db, "--host", "127.0.0.1",
               "--http-port", "0", "--grpc-port", "0", "--json"]
        if self.token:
            cmd += ["--token", self.token]
        if self.annotate_token:
            cmd += ["--annotate-token", self.annotate_token]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTAPE_")} | self.extra_env
        with open(self.log, "w") as err:  # a file, not a pipe nobody reads: the server never blocks on it
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            self.proc.wait(30)
            raise RuntimeError(f"agenttape serve did not start: {Path(self.log).read_text()[-3000:]}")
        self.url = json.loads(line)["url"].rstrip("/")
        return self

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def export_env(self) -> dict[str, str]:
        """Environment for another process's OTLP exporters to send here (with the token)."""
        env = dict(os.environ)
        if self.token:
            env["OTEL_EXPORTER_OTLP_HEADERS"] = f"authorization=Bearer%20{self.token}"
        return env

    def metric(self, text: str, name: str) -> float:
        return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    def wait_idle(self, timeout: float = 60) -> bool:
        """True once every span and log record the server accepted is stored (its own /metrics say so)."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=30).text
            accepted = self.metric(text, "agenttape_spans_accepted_total")
            done = sum(self.metric(text, f"agenttape_spans_{k}_total") for k in ("stored", "duplicate", "conflicting"))
            logs = self.metric(text, "agenttape_logs_accepted_total") - self.metric(text, "agenttape_logs_stored_total")
            if accepted and done >= accepted and logs <= 0 and self.metric(text, "agenttape_queue_items") == 0:
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def __enter__(self) -> AgenttapeServe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def record_fleet(server: Any, children: int = FLEET_CHILDREN) -> str:
    """A coordinator that starts ``children`` specialists, each with one tool call; returns its run id."""
    tape = recorder(server, "fleet-app")
    try:
        with tape.run(agent="fleet", session_id="fleet-session", input="Survey fifty cities") as run:
            for i in range(children):
                with run.child(agent=f"surveyor-{i:02d}", input=f"city {i}") as child:
                    with child.tool_call("lookup", {"city": i}, call_id=f"c{i}") as tool:
                        tool.result({"city": i, "population": 1000 + i})
                    child.set_output(f"city {i} has {1000 + i} people")
            run.set_output("surveyed fifty cities")
            rid = run.run_id
    finally:
        tape.shutdown()
    return rid


def record_nested(server: Any, depth: int = 3) -> str:
    """A run with nested children ``depth`` levels below it (one per level, plus a sibling at the top)."""
    tape = recorder(server, "nested-app")
    try:
        with tape.run(agent="level-0", input="go deep") as root:
            with contextlib.ExitStack() as stack:
                cur = root
                for level in range(1, depth + 1):
                    cur = stack.enter_context(cur.child(agent=f"level-{level}", input=f"level {level}"))
                    cur.set_output(f"answer from level {level}")
            with root.child(agent="sibling") as sib:
                sib.set_output("a sibling at level 1")
            root.set_output("done")
            rid = root.run_id
    finally:
        tape.shutdown()
    return rid


PRICED_OPENAI_USAGE = {"prompt_tokens": 1000, "completion_tokens": 500, "prompt_tokens_details": {"cached_tokens": 200}}
PRICED_OPENAI_USD = (800 * 2.5 + 200 * 1.25 + 500 * 10) / 1e6  # gpt-4o in genai-prices: $0.00725


def record_priced(server: Any) -> str:
    """A session ``cost-session`` of two turns: ``buyer`` (a gpt-4o call) with a child ``pricer`` (a
    gpt-4o call and a call to a self-hosted model that has no price), then ``buyer-2`` (the self-hosted
    model only). Returns the first turn's run id."""
    tape = recorder(server, "priced-app")
    try:
        with tape.run(agent="buyer", session_id="cost-session", input="buy") as run:
            with run.model_call(model="gpt-4o", provider="openai", messages="plan") as call:
                call.finish(text="a plan", usage=PRICED_OPENAI_USAGE)
            with run.child(agent="pricer", input="price it") as child:
                with child.model_call(model="acme-local-70b", provider="vllm", messages="guess") as call:
                    call.finish(text="guessed", usage={"prompt_tokens": 10, "completion_tokens": 5})
                with child.model_call(model="gpt-4o", provider="openai", messages="again") as call:
                    call.finish(text="again", usage=PRICED_OPENAI_USAGE)
                child.set_output("priced")
            run.set_output("bought")
            rid = run.run_id
        with tape.run(agent="buyer-2", session_id="cost-session", input="again") as run:
            with run.model_call(model="acme-local-70b", provider="vllm", messages="hi") as call:
                call.finish(text="hello", usage={"prompt_tokens": 10, "completion_tokens": 5})
            run.set_output("hello")
    finally:
        tape.shutdown()
    return rid


def record_hostile(server: Any) -> str:
    """A run whose content is HTML that would run script if a page ever parsed it as HTML."""
    tape = recorder(server, "hostile-app")
    try:
        with tape.run(agent=XSS_AGENT, input=XSS_SCRIPT) as run:
            messages = [{"role": "user", "content": XSS_SCRIPT}]
            with run.model_call(model="m<i>x</i>", messages=messages, provider="p") as call:
                call.delta(XSS_TOOL_RESULT)
                call.finish(usage={"prompt_tokens": 3, "completion_tokens": 4},
                            tool_calls=[{"id": "x1", "name": "fetch_html", "arguments": {"html": XSS_SCRIPT}}])
            with run.tool_call("fetch_html", {"html": XSS_SCRIPT}, call_id="x1") as tool:
                tool.result(XSS_TOOL_RESULT)
            run.set_output(XSS_TOOL_RESULT + XSS_SCRIPT)
            rid = run.run_id
    finally:
        tape.shutdown()
    return rid


@contextlib.contextmanager
def serve_console(tapes: Any, token: str | None = None) -> Iterator[str]:
    """The console app under uvicorn on a free loopback port, in a thread; yields its URL."""
    from otel_agenttape.console.app import create_app
    from otel_agenttape.console.serve import bound_url, make_server

    server = make_server(create_app(tapes, token=token), "127.0.0.1", 0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the console did not start")
        time.sleep(0.02)
    try:
        yield bound_url(server).rstrip("/")
    finally:
        server.should_exit = True
        thread.join(10)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
