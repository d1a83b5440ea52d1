"""Real receivers on 127.0.0.1 for the capture fault tests: an in-process ``TapeServer`` on fixed
ports (so it can be stopped and started again at the same address), a slow OTLP/HTTP endpoint and a
closed port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket stays bound until all are chosen (ports taken one by one
    can come back equal, since a closed socket's port is free again at once)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlowOtlpHttp:
    """Takes every request, waits ``delay`` seconds, then answers 200 (a receiver that cannot keep up);
    while ``down`` it answers 503. ``names`` are the span names received, in order."""

    def __init__(self, delay: float, down: bool = False) -> None:
        self.delay = delay
        self.down = down
        self.spans = 0
        self.requests = 0
        self.names: list[str] = []
        self.run_ids: list[str] = []  # of the run spans, in the order received
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if outer.down:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req = ExportTraceServiceRequest.FromString(body)
                time.sleep(outer.delay)
                with outer._lock:
                    outer.requests += 1
                    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
                    outer.spans += len(spans)
                    outer.names.extend(s.name for s in spans)
                    outer.run_ids.extend(a.value.string_value for s in spans for a in s.attributes
                                         if a.key == "agenttape.run.id" and s.name.startswith("invoke_agent"))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_process(db: str, http_port: int, grpc_port: int, *extra: str) -> tuple[subprocess.Popen, dict]:
    """``agenttape serve`` in its own process on the given ports; returns (process, its JSON line)."""
    from receiver_util import free_env

    deadline = time.monotonic() + 30
    while True:
        proc = subprocess.Popen(
            [sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", db, "--host", "127.0.0.1",
             "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--json", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=free_env(),
        )
        line = proc.stdout.readline()
        if line:
            return proc, json.loads(line)
        err = proc.stderr.read()
        proc.wait()
        if time.monotonic() > deadline or "in use" not in err.lower():  # the old socket may linger briefly
            raise AssertionError(f"serve did not start: {err}")
        time.sleep(0.5)


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
