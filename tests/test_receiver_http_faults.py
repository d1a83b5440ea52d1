"""OTLP/HTTP receiver under faults and abuse, on 127.0.0.1 with raw sockets where a well-behaved client
would not do it: request smuggling framing, truncated uploads, oversized bodies, too many spans, bad
spans among good ones, slow clients, too many connections, and the extension hook for more routes."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from receiver_util import PB, free_env, grpc_call, span_keys, stored_keys, trace_request

from otel_agenttape.receiver.limits import Limits
from otel_agenttape.receiver.server import TapeServer


@pytest.fixture
def server(tmp_path):
    srv = TapeServer(str(tmp_path / "tape.duckdb"), http_port=0, grpc_port=0).start()
    yield srv
    srv.stop()


def _connect(srv: TapeServer, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.http_port), timeout=timeout)


def _read_all(sock: socket.socket, limit: float = 10.0) -> bytes:
    """Everything the server sends until it closes (or ``limit`` seconds pass)."""
    sock.settimeout(limit)
    out = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def _head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _count(srv: TapeServer) -> int:
    assert srv.wait_idle(20)
    return srv.query("SELECT count(*) FROM spans").column(0)[0].as_py()


def _metric(srv: TapeServer, line_start: str) -> float:
    for line in srv.render_metrics().splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_content_length_with_chunked_is_refused_and_nothing_stored(server):
    body = trace_request(3).SerializeToString()
    # a front end that reads the chunks and a back end that reads the length see different requests
    for framed in (body, f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"):
        with _connect(server) as s:
            s.sendall(_head("/v1/traces", {**PB, "Content-Length": str(len(framed)), "Transfer-Encoding": "chunked"})
                      + framed)
            reply = _read_all(s)
        assert reply.startswith(b"HTTP/1.1 400 ")
        head, _, status = reply.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head.lower()
        assert "can't be present with" in json.loads(status)["message"]
    assert _count(server) == 0
    ok = httpx.post(f"{server.url}/v1/traces", content=body, headers=PB)  # the server is fine afterwards
    assert ok.status_code == 200 and _count(server) == 3


def test_a_transfer_coding_other_than_chunked_is_refused(server):
    body = trace_request(1).SerializeToString()
    with _connect(server) as s:
        s.sendall(_head("/v1/traces", {**PB, "Transfer-Encoding": "gzip, chunked"})
                  + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        reply = _read_all(s)
    assert reply.split(b"\r\n", 1)[0] in (b"HTTP/1.1 400 Bad Request", b"HTTP/1.1 501 Not Implemented")
    assert _count(server) == 0


def test_a_body_cut_short_is_neither_stored_nor_acknowledged(server):
    # two resource spans: the first half alone is a valid request (what the old receiver stored)
    first, second = trace_request(4), trace_request(4)
    req = ExportTraceServiceRequest()
    req.resource_spans.extend([first.resource_spans[0], second.resource_spans[0]])
    body = req.SerializeToString()
    half = len(first.SerializeToString())
    assert ExportTraceServiceRequest.FromString(body[:half]) == first
    with _connect(server) as s:
        s.sendall(_head("/v1/traces", {**PB, "Content-Length": str(len(body))}) + body[:half])
        s.shutdown(socket.SHUT_WR)  # the client gives up half-way
        reply = _read_all(s)
    assert reply == b""  # no 200, nothing at all: the exporter must send it again
    assert _count(server) == 0
    assert _metric(server, 'agenttape_http_refused_total{reason="truncated_body"}') == 1
    assert _metric(server, 'agenttape_spans_accepted_total') == 0


def test_a_body_over_the_limit_gets_its_413_and_the_connection_stays_usable(server):
    big = b"\x0a" + b"\xff" * (40 * 1024 * 1024)
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("POST", "/v1/traces", body=big, headers=PB)  # the old receiver reset this send
    resp = conn.getresponse()
    st = status_pb2.Status.FromString(resp.read())
    assert resp.status == 413 and "exceeds the limit of 20971520 bytes" in st.message
    conn.request("POST", "/v1/traces", body=trace_request(2).SerializeToString(), headers=PB)
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b""
    conn.close()
    assert _count(server) == 2


def test_the_official_exporter_does_not_retry_a_413(server):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    # a 40 MB span: over the receiver's 20 MiB, under the exporter's own request limit
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", max_request_size=128 * 1024 * 1024, timeout=60)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    t0 = time.monotonic()
    with provider.get_tracer("t").start_as_current_span("huge") as span:
        span.set_attribute("blob", "x" * (40 * 1024 * 1024))
    provider.shutdown()
    elapsed = time.monotonic() - t0
    # one attempt, answered: a connection reset would have made the exporter try again, and again
    assert _metric(server, 'agenttape_requests_total{code="413",signal="traces",transport="http"}') == 1
    assert elapsed < 30
    assert _count(server) == 0


def _empty_spans_request(n: int) -> bytes:
    """A request of ``n`` empty spans, built on the wire (2 bytes each; building messages would take minutes)."""
    def length(x: int) -> bytes:
        out = b""
        while True:
            b, x = x & 0x7F, x >> 7
            out += bytes([b | (0x80 if x else 0)])
            if not x:
                return out

    scope = b"\x12\x00" * n
    resource = b"\x12" + length(len(scope)) + scope
    return b"\x0a" + length(len(resource)) + resource


def test_millions_of_empty_spans_are_refused_at_once(server):
    body = _empty_spans_request(6_000_000)  # 12 MB: under the body limit
    t0 = time.monotonic()
    r = httpx.post(f"{server.url}/v1/traces", content=body, headers=PB, timeout=60)
    elapsed = time.monotonic() - t0
    assert r.status_code == 413
    assert "exceed the limit of 100,000 per request" in status_pb2.Status.FromString(r.content).message
    assert elapsed < 5  # the old receiver decoded all of them first: 18.6 s
    assert _metric(server, 'agenttape_requests_too_many_items_total{signal="traces"}') == 1


def test_spans_per_request_limit_on_every_encoding_and_transport(tmp_path):
    from integrity_support import otlp_json

    srv = TapeServer(str(tmp_path / "few.duckdb"), http_port=0, grpc_port=0,
                     limits=Limits(max_spans_per_request=10)).start()
    try:
        over, fits = trace_request(11), trace_request(10)
        r = httpx.post(f"{srv.url}/v1/traces", content=over.SerializeToString(), headers=PB)
        assert r.status_code == 413 and "limit of 10 per request" in status_pb2.Status.FromString(r.content).message
        r = httpx.post(f"{srv.url}/v1/traces", content=otlp_json(over), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "limit of 10 per request" in r.json()["message"]
        import grpc

        code, _, _ = grpc_call(srv.grpc_port, over.SerializeToString())
        assert code == grpc.StatusCode.INVALID_ARGUMENT  # never retried, unlike RESOURCE_EXHAUSTED
        assert httpx.post(f"{srv.url}/v1/traces", content=fits.SerializeToString(), headers=PB).status_code == 200
        assert stored_keys(srv) == span_keys(fits)
    finally:
        srv.stop()


def _worker_rss_mb(srv: TapeServer) -> list[float]:
    pool = srv.pipeline.pool._pool
    out = []
    for pid in pool._processes:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    out.append(int(line.split()[1]) / 1024)
    return out


def test_a_converter_gives_back_the_memory_of_a_large_request(tmp_path):
    srv = TapeServer(str(tmp_path / "mem.duckdb"), http_port=0, grpc_port=0, ingest_workers=1).start()
    try:
        srv.pipeline.pool.start()
        before = max(_worker_rss_mb(srv))
        req = trace_request(100_000)  # tiny spans, at the default per-request limit
        body = req.SerializeToString()
        r = httpx.post(f"{srv.url}/v1/traces", content=body, headers=PB, timeout=120)
        assert r.status_code == 200
        assert _count(srv) == 100_000
        after = max(_worker_rss_mb(srv))
        # generous: converting took a few hundred MB at its peak; what stays is a fraction of it
        assert after - before < 150, (before, after)
    finally:
        srv.stop()


def _bad_spans_request() -> tuple[ExportTraceServiceRequest, bytes]:
    req = trace_request(4)
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[1].end_time_unix_nano = spans[1].start_time_unix_nano - 1  # ends before it starts
    spans[2].start_time_unix_nano = 2**63 + 7  # past what an int64 holds
    spans[3].name = "MARK"
    body = req.SerializeToString().replace(b"MARK", b"M\xff\xfeK")  # not UTF-8
    return req, body


def test_bad_times_and_strings_reject_only_their_span(server):
    import grpc
    from integrity_support import otlp_json

    req, body = _bad_spans_request()
    good = {(req.resource_spans[0].scope_spans[0].spans[0].trace_id.hex(),
             req.resource_spans[0].scope_spans[0].spans[0].span_id.hex())}
    r = httpx.post(f"{server.url}/v1/traces", content=body, headers=PB)
    assert r.status_code == 200
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_spans == 3
    for words in ("before start_time_unix_nano", "the year 2262", "not valid UTF-8"):
        assert words in partial.error_message
    assert stored_keys(server) == good
    # gRPC: the same spans, the same answer
    req2, body2 = _bad_spans_request()
    code, resp, _ = grpc_call(server.grpc_port, body2)
    assert code == grpc.StatusCode.OK and ExportTraceServiceResponse.FromString(resp).partial_success.rejected_spans == 3
    # OTLP JSON: a lone surrogate escape is not text either
    req3 = trace_request(3)
    spans = req3.resource_spans[0].scope_spans[0].spans
    spans[1].end_time_unix_nano = 5
    spans[2].name = "MARK"
    doc = otlp_json(req3)
    doc = (doc if isinstance(doc, str) else doc.decode()).replace("MARK", "\\ud800")
    r = httpx.post(f"{server.url}/v1/traces", content=doc, headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == "2"
    assert len(stored_keys(server)) == 3
    m = server.render_metrics()
    assert 'agenttape_spans_rejected_total{reason="invalid_time"} 5' in m
    assert 'agenttape_spans_rejected_total{reason="invalid_utf8"} 3' in m


def _trickle(sock: socket.socket, data: bytes, every: float, stop: threading.Event) -> None:
    for i in range(len(data)):
        if stop.wait(every):
            return
        try:
            sock.sendall(data[i:i + 1])
        except OSError:
            return


def test_slow_clients_are_cut_off_while_others_are_served(tmp_path):
    limits = Limits(header_timeout=1.5, body_timeout=2.5)
    srv = TapeServer(str(tmp_path / "slow.duckdb"), http_port=0, grpc_port=0, limits=limits).start()
    stop = threading.Event()
    try:
        body = trace_request(2).SerializeToString()
        heads, bodies = _connect(srv), _connect(srv)
        # headers one byte at a time, forever
        threading.Thread(target=_trickle, args=(heads, _head("/v1/traces", PB) * 50, 0.2, stop), daemon=True).start()
        bodies.sendall(_head("/v1/traces", {**PB, "Content-Length": str(len(body))}))
        threading.Thread(target=_trickle, args=(bodies, body, 0.2, stop), daemon=True).start()
        t0 = time.monotonic()
        served = 0
        with httpx.Client(timeout=10) as c:
            while time.monotonic() - t0 < 2.0:
                r = c.post(f"{srv.url}/v1/traces", content=trace_request(1).SerializeToString(), headers=PB)
                assert r.status_code == 200
                served += 1
        assert served >= 3
        got_heads, got_bodies = _read_all(heads, 10), _read_all(bodies, 10)
        elapsed = time.monotonic() - t0
        assert got_heads.startswith(b"HTTP/1.1 408 ") and b"within 1.5 s" in got_heads
        assert got_bodies.startswith(b"HTTP/1.1 408 ") and b"within 2.5 s" in got_bodies
        assert elapsed < 8
        assert _count(srv) == served  # the trickled body was never stored
        m = srv.render_metrics()
        assert 'agenttape_http_refused_total{reason="header_timeout"} 1' in m
        assert 'agenttape_http_refused_total{reason="body_timeout"} 1' in m
    finally:
        stop.set()
        srv.stop()


def test_connections_past_the_limit_get_503_with_retry_after(tmp_path):
    srv = TapeServer(str(tmp_path / "conns.duckdb"), http_port=0, grpc_port=0,
                     limits=Limits(max_connections=3)).start()
    idle = []
    try:
        idle = [_connect(srv) for _ in range(3)]
        deadline = time.monotonic() + 5
        while srv._http.connections < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = httpx.post(f"{srv.url}/v1/traces", content=trace_request(1).SerializeToString(), headers=PB)
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.headers["connection"] == "close"
        assert "more than 3 connections" in status_pb2.Status.FromString(r.content).message
        for s in idle:
            s.close()
        deadline = time.monotonic() + 5
        while srv._http.connections and time.monotonic() < deadline:
            time.sleep(0.01)
        r = httpx.post(f"{srv.url}/v1/traces", content=trace_request(1).SerializeToString(), headers=PB)
        assert r.status_code == 200
        assert _metric(srv, 'agenttape_http_refused_total{reason="max_connections"}') == 1
    finally:
        for s in idle:
            s.close()
        srv.stop()


def test_extra_routes_and_a_fallback_app_share_the_port(tmp_path):
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def ping(request):
        return PlainTextResponse("pong")

    async def fallback(scope, receive, send):
        await PlainTextResponse(f"console {scope['path']}")(scope, receive, send)

    srv = TapeServer(str(tmp_path / "ext.duckdb"), http_port=0, grpc_port=0,
                     http_routes=[Route("/api/ping", ping)], http_fallback=fallback).start()
    try:
        with httpx.Client(timeout=10) as c:
            assert c.get(f"{srv.url}/api/ping").text == "pong"
            assert c.get(f"{srv.url}/").text == "console /"
            assert c.get(f"{srv.url}/runs/abc").text == "console /runs/abc"
            assert c.get(f"{srv.url}/healthz").text == "ok\n"  # the receiver's own paths come first
            assert c.post(f"{srv.url}/v1/traces", content=trace_request(2).SerializeToString(),
                          headers=PB).status_code == 200
            assert c.post(f"{srv.url}/api/query", json={"sql": "SELECT 1 AS x"}).status_code == 200
        assert _count(srv) == 2
    finally:
        srv.stop()


def test_serve_flags_set_the_limits(tmp_path):
    db = tmp_path / "flags.duckdb"
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", str(db), "--http-port", "0", "--grpc-port", "0",
         "--json", "--ingest-workers", "0", "--max-body", "4000", "--max-spans-per-request", "5",
         "--max-connections", "50", "--header-timeout", "1", "--body-timeout", "2", "--idle-timeout", "3"],
        stdout=subprocess.PIPE, text=True, env=free_env())
    try:
        info = json.loads(proc.stdout.readline())
        url = info["url"]
        with httpx.Client(timeout=10) as c:
            r = c.post(f"{url}/v1/traces", content=trace_request(6).SerializeToString(), headers=PB)
            assert r.status_code == 413 and "limit of 5 per request" in status_pb2.Status.FromString(r.content).message
            big = trace_request(5, attrs={"pad": "x" * 1000}).SerializeToString()
            assert len(big) > 4000
            r = c.post(f"{url}/v1/traces", content=big, headers=PB)
            assert r.status_code == 413 and "limit of 4000 bytes" in status_pb2.Status.FromString(r.content).message
            assert c.post(f"{url}/v1/traces", content=trace_request(5).SerializeToString(), headers=PB).status_code == 200
        s = socket.create_connection(("127.0.0.1", info["http_port"]), timeout=10)
        s.sendall(b"POST /v1/traces HTTP/1.1\r\n")
        t0 = time.monotonic()
        assert _read_all(s, 10).startswith(b"HTTP/1.1 408 ")
        assert time.monotonic() - t0 < 5
        s.close()
        bad = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "serve", "--db", str(tmp_path / "x.duckdb"),
                              "--max-connections", "0"], capture_output=True, text=True, env=free_env())
        assert bad.returncode == 2 and "max_connections must be at least 1" in bad.stderr
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
