"""OTLP/HTTP receiver (``POST /v1/traces``, ``/v1/logs``) plus ``/healthz``, ``/metrics`` and ``/api/query``.

Built on the standard library's threading HTTP server with HTTP/1.1 keep-alive: one thread per
connection; the work per request (decode, validate, WAL append) is short and the WAL's group commit
lets concurrent requests share a disk flush.
"""

from __future__ import annotations

import hmac
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from otel_agenttape.receiver.decode import (
    JSON,
    BodyTooLarge,
    DecodeError,
    UnsupportedMediaType,
    decompress,
    encode_message,
    media_type,
)
from otel_agenttape.receiver.metrics import Metrics
from otel_agenttape.receiver.pipeline import Backpressure
from otel_agenttape.receiver.service import LOGS, TRACES, ExportService, rpc_status
from otel_agenttape.receiver.wal import WalClosed

log = logging.getLogger(__name__)

_EXPORT_PATHS = {"/v1/traces": TRACES, "/v1/logs": LOGS}
# google.rpc.Code values used in error bodies
_CODE = {400: 3, 401: 16, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 429: 8, 500: 13, 503: 14}


@dataclass
class HttpContext:
    """What the HTTP handlers need from the server that owns them."""

    service: ExportService
    metrics: Metrics
    token: str | None
    max_body: int
    is_ready: Callable[[], bool]
    render_metrics: Callable[[], str]
    run_query: Callable[[bytes], tuple[int, str, bytes]]  # POST /api/query body -> (status, type, body)
    health: Callable[[], str | None] | None = None  # why /healthz answers 503 (None: healthy)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr: tuple[str, int], ctx: HttpContext) -> None:
        self.ctx = ctx
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """End idle keep-alive connections so a stopped server lets go of its clients."""
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()


class _HttpError(Exception):
    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "agenttape"
    timeout = 120
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    # -- plumbing -----------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_status(self, err: _HttpError, media: str = JSON) -> None:
        st = rpc_status(_CODE.get(err.status, 2), str(err), err.retry_after, bad_request=err.status == 400)
        headers = {}
        if err.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(err.retry_after)))
        if err.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="agenttape"'
        self._send(err.status, encode_message(st, media), media, headers)

    def _reply_media(self) -> str:
        """The encoding of an error reply: the request's own when it is OTLP protobuf, else JSON."""
        try:
            return media_type(self.headers.get("Content-Type"))
        except UnsupportedMediaType:
            return JSON

    def _authorized(self) -> bool:
        token = self.server.ctx.token
        if not token:
            return True
        got = self.headers.get("Authorization", "")
        scheme, _, value = got.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())

    def _read_body(self, limit: int) -> bytes:
        length = self.headers.get("Content-Length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                self.close_connection = True
                raise _HttpError(400, "invalid Content-Length") from None
            if n < 0:
                self.close_connection = True
                raise _HttpError(400, "invalid Content-Length")
            if n > limit:
                self.close_connection = True  # the body is never read
                raise _HttpError(413, f"request body of {n} bytes exceeds the limit of {limit} bytes")
            return self.rfile.read(n)
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(limit)
        self.close_connection = True
        raise _HttpError(411, "Content-Length or chunked Transfer-Encoding required")

    def _read_chunked(self, limit: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise _HttpError(400, "invalid chunked encoding") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            total += size
            if total > limit:
                self.close_connection = True
                raise _HttpError(413, f"request body exceeds the limit of {limit} bytes")
            parts.append(self.rfile.read(size))
            self.rfile.readline(1024)

    def _discard_body(self) -> None:
        """Read and drop a small body so the connection can be reused; close it otherwise."""
        length = self.headers.get("Content-Length")
        if length is not None:
            if length.isdigit() and int(length) <= 1024 * 1024:
                self.rfile.read(int(length))
            else:
                self.close_connection = True
        elif "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True

    # -- routes -------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        ctx = self.server.ctx
        if path == "/healthz":
            reason = ctx.health() if ctx.health is not None else (None if ctx.is_ready() else "starting")
            body = b"ok\n" if reason is None else reason.encode("utf-8", "replace") + b"\n"
            self._send(200 if reason is None else 503, body, "text/plain; charset=utf-8")
            return
        if not self._authorized():
            self._send_status(_HttpError(401, "missing or wrong bearer token"))
            return
        if path == "/metrics":
            try:
                text = ctx.render_metrics()
            except Exception as exc:  # noqa: BLE001 - a scrape must not kill the server
                self._send_status(_HttpError(500, f"metrics failed: {exc}"))
                return
            self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            return
        if path in _EXPORT_PATHS or path == "/api/query":
            self._send_status(_HttpError(405, f"use POST for {path}"))
            return
        self._send_status(_HttpError(404, f"no route {path}"))

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        start = time.perf_counter()
        path = self.path.split("?", 1)[0]
        ctx = self.server.ctx
        if path == "/healthz":
            self._discard_body()
            self._send_status(_HttpError(405, "use GET for /healthz"))
            return
        if not self._authorized():
            self._discard_body()
            self._send_status(_HttpError(401, "missing or wrong bearer token"), self._reply_media())
            if path in _EXPORT_PATHS:
                ctx.metrics.inc("agenttape_requests_total", transport="http", signal=_EXPORT_PATHS[path], code="401")
            return
        if path == "/api/query":
            self._query()
            return
        signal = _EXPORT_PATHS.get(path)
        if signal is None:
            self._discard_body()
            self._send_status(_HttpError(404, f"no route {path}"), self._reply_media())
            return
        media = JSON
        status = 200
        raw = None
        try:
            media = media_type(self.headers.get("Content-Type"))
            try:
                ctx.service.pipeline.check_admission()  # refuse before reading a body we cannot queue
            except Backpressure:
                self._discard_body()
                raise
            raw = self._read_body(ctx.max_body)
            body = decompress(raw, self.headers.get("Content-Encoding"), ctx.max_body)
            resp = ctx.service.export(signal, body, media)
            self._send(200, encode_message(resp, media), media)
            ctx.metrics.observe("agenttape_ingest_latency_seconds", time.perf_counter() - start)
        except UnsupportedMediaType as exc:
            status = 415
            if raw is None:
                self._discard_body()
            self._send_status(_HttpError(415, str(exc)), media)
        except BodyTooLarge as exc:
            status = 413
            self._send_status(_HttpError(413, str(exc)), media)
        except DecodeError as exc:
            status = 400
            self._send_status(_HttpError(400, str(exc)), media)
        except _HttpError as exc:
            status = exc.status
            self._send_status(exc, media)
        except Backpressure as exc:
            status = 503 if exc.unavailable else 429
            self._send_status(_HttpError(status, str(exc), exc.retry_after), media)
        except (WalClosed, OSError) as exc:
            status = 503
            log.error("cannot make a request durable: %s", exc)
            self._send_status(_HttpError(503, f"cannot store the request now: {exc}", 5.0), media)
        ctx.metrics.inc("agenttape_requests_total", transport="http", signal=signal, code=str(status))

    def _query(self) -> None:
        ctx = self.server.ctx
        try:
            body = self._read_body(1024 * 1024)
        except _HttpError as exc:
            self._send(exc.status, orjson.dumps({"error": str(exc)}), JSON)
            return
        try:
            status, content_type, out = ctx.run_query(body)
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            status, content_type, out = 500, JSON, orjson.dumps({"error": f"query failed: {exc}"})
        self._send(status, out, content_type)


class HttpReceiver:
    """The HTTP listener, served from a background thread."""

    def __init__(self, host: str, port: int, ctx: HttpContext) -> None:
        self._server = _Server((host, port), ctx)
        self.port = self._server.server_address[1]
        self._thread: Any = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="agenttape-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
