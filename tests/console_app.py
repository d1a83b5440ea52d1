"""What the console tests record and how they serve it: the demo, a wide fleet, deep nesting, hostile content.

Everything goes through the real capture API and OTLP exporter into a real receiver on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import otel_agenttape

XSS_TOOL_RESULT = '<img src="/xss-img" onerror="window.__xss = 1; fetch(\'/xss-onerror\')">'
XSS_SCRIPT = "<script>window.__xss = 2; fetch('/xss-script')</script>"
XSS_AGENT = '<b onmouseover="window.__xss=3">hostile</b>'
FLEET_CHILDREN = 50


def recorder(server: Any, service: str) -> Any:
    return otel_agenttape.setup(endpoint=server.url, protocol="http/protobuf", service_name=service)


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
