"""OTLP/HTTP receiver (``POST /v1/traces``, ``/v1/logs``) plus ``/healthz``, ``/metrics``, ``/api/query``
and the routes that rewrite the store (``/api/erase``, ``/api/retain``: token-gated, loopback-only without a token).

Served by uvicorn (HTTP/1.1 parsing by llhttp through httptools) on an event loop in a background
thread, routed by Starlette. The server stack owns connections, framing and slow clients
(``httpproto.py``: per-phase deadlines, a bound on open connections); this module owns OTLP: media
types, limits of a body (``httpbody.py``), status codes and error bodies. The blocking part of an
export (decompress, decode, validate, WAL append and its fsync wait) runs in a bounded thread pool,
so a slow request never holds up the loop or the other requests; ``/metrics`` and ``/api/query``
have a small pool of their own, so a long query cannot take the threads exports need.

Extension point: the caller may serve more on the same port, for example a web console::

    from starlette.routing import Route
    HttpReceiver(host, port, ctx, extra_routes=[Route("/console/ping", ping)], fallback=console_app)

``extra_routes`` (Starlette routes) are tried after the receiver's own paths; ``fallback`` (any
ASGI app) gets every request no route matched, instead of the receiver's 404. ``TapeServer`` passes
them through as ``http_routes=`` and ``http_fallback=``. The receiver's bearer token does not gate
them: an app that serves content checks ``authorized(scope, token)`` itself.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route

from otel_agenttape.codec.otlp_decode import (
    JSON,
    LOGS,
    TRACES,
    BodyTooLarge,
    DecodeError,
    UnsupportedMediaType,
    decompress,
    encode_message,
    media_type,
)
from otel_agenttape.receiver.httpbody import BodyBudget, ClientGone, HttpError, discard_body, header, read_body
from otel_agenttape.receiver.httpproto import OVER_LIMIT, TIMED_OUT, protocol_class
from otel_agenttape.receiver.limits import Limits
from otel_agenttape.receiver.metrics import Metrics
from otel_agenttape.receiver.pipeline import Backpressure
from otel_agenttape.receiver.service import ExportService, rpc_status
from otel_agenttape.receiver.wal import WalClosed

log = logging.getLogger(__name__)

_EXPORT_PATHS = {"/v1/traces": TRACES, "/v1/logs": LOGS}
# google.rpc.Code values used in error bodies
_CODE = {400: 3, 401: 16, 404: 5, 405: 12, 408: 4, 411: 3, 413: 8, 415: 3, 429: 8, 500: 13, 501: 12, 503: 14}
_QUERY_BODY_LIMIT = 1024 * 1024
_TEXT = "text/plain; charset=utf-8"


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
    limits: Limits | None = None  # None: the defaults, with ``max_body``
    ingest_threads: int = 32  # threads running the blocking part of exports
    read_threads: int = 4  # threads for /metrics and /api/query
    health: Callable[[], str | None] | None = None  # why /healthz answers 503 (None: healthy)
    run_erase: Callable[[bytes], tuple[int, str, bytes]] | None = None  # POST /api/erase body -> reply
    run_retain: Callable[[bytes], tuple[int, str, bytes]] | None = None  # POST /api/retain body -> reply


@dataclass
class _Reply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


def authorized(scope: dict[str, Any], token: str | None) -> bool:
    """True when ``token`` is unset or the request carries ``Authorization: Bearer <token>``."""
    if not token:
        return True
    scheme, _, value = (header(scope, b"authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def _status_reply(err: HttpError, media: str = JSON) -> _Reply:
    st = rpc_status(_CODE.get(err.status, 2), str(err), err.retry_after, bad_request=err.status == 400)
    headers = {}
    if err.retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(err.retry_after)))
    if err.status == 401:
        headers["www-authenticate"] = 'Bearer realm="agenttape"'
    if err.close:
        headers["connection"] = "close"
    return _Reply(err.status, encode_message(st, media), media, headers)


def _reply_media(scope: dict[str, Any]) -> str:
    """The encoding of an error reply: the request's own when it is OTLP protobuf, else JSON."""
    try:
        return media_type(header(scope, b"content-type"))
    except UnsupportedMediaType:
        return JSON


async def _send(send: Callable[..., Any], scope: dict[str, Any], reply: _Reply) -> None:
    headers = [(b"content-type", reply.content_type.encode()), (b"content-length", str(len(reply.body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in reply.headers.items()]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else reply.body})


class _App:
    """The receiver's routes as ASGI callables (Starlette routes them; requests reach here raw)."""

    def __init__(self, ctx: HttpContext, limits: Limits) -> None:
        self.ctx = ctx
        self.limits = limits
        self.budget = BodyBudget(limits.inflight_bytes)
        self.ingest = ThreadPoolExecutor(ctx.ingest_threads, thread_name_prefix="agenttape-http")
        self.reads = ThreadPoolExecutor(ctx.read_threads, thread_name_prefix="agenttape-http-read")

    def close(self) -> None:
        self.ingest.shutdown(wait=True, cancel_futures=True)
        self.reads.shutdown(wait=True, cancel_futures=True)

    async def _over_limit(self, scope: dict[str, Any], receive: Any, send: Any) -> bool:
        """A connection past ``max_connections``: 503 + Retry-After, after reading (a bounded part of) its body."""
        if not scope.get(OVER_LIMIT):
            return False
        await discard_body(receive, self.limits.max_body)
        msg = f"more than {self.limits.max_connections} connections open; retry later"
        await _send(send, scope, _status_reply(HttpError(503, msg, retry_after=1.0, close=True), _reply_media(scope)))
        return True

    async def healthz(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await self._over_limit(scope, receive, send):
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _send(send, scope, _status_reply(HttpError(405, "use GET for /healthz"), _reply_media(scope)))
            return
        ctx = self.ctx
        reason = ctx.health() if ctx.health is not None else (None if ctx.is_ready() else "starting")
        body = b"ok\n" if reason is None else reason.encode("utf-8", "replace") + b"\n"
        await _send(send, scope, _Reply(200 if reason is None else 503, body, _TEXT))

    async def metrics(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await self._over_limit(scope, receive, send):
            return
        media = _reply_media(scope)
        if not authorized(scope, self.ctx.token):
            reply = _status_reply(HttpError(401, "missing or wrong bearer token"), media)
        elif scope["method"] not in ("GET", "HEAD"):
            reply = _status_reply(HttpError(405, "use GET for /metrics"), media)
        else:
            try:
                text = await asyncio.get_running_loop().run_in_executor(self.reads, self.ctx.render_metrics)
                reply = _Reply(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            except Exception as exc:  # noqa: BLE001 - a scrape must not kill the server
                reply = _status_reply(HttpError(500, f"metrics failed: {exc}"))
        await _send(send, scope, reply)

    async def query(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await self._over_limit(scope, receive, send):
            return
        if not authorized(scope, self.ctx.token):
            await _send(send, scope, _status_reply(HttpError(401, "missing or wrong bearer token"), _reply_media(scope)))
            return
        if scope["method"] != "POST":
            await _send(send, scope, _status_reply(HttpError(405, "use POST for /api/query")))
            return
        await self._run_on_body(scope, receive, send, self.ctx.run_query, "query")

    async def erase(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """``POST /api/erase``: an erasure in the store while ingest goes on (``TapeServer.erase``)."""
        await self._rewrite(scope, receive, send, self.ctx.run_erase, "/api/erase", "erasure")

    async def retain(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """``POST /api/retain``: retention in the store while ingest goes on (``TapeServer.retain``)."""
        await self._rewrite(scope, receive, send, self.ctx.run_retain, "/api/retain", "retention")

    async def _rewrite(self, scope: dict[str, Any], receive: Any, send: Any, handler: Any, path: str,
                       what: str) -> None:
        """The routes that rewrite the store file: they need the bearer token; a server without one takes
        them from a loopback client only."""
        if await self._over_limit(scope, receive, send):
            return
        client = (scope.get("client") or ("",))[0]
        if not authorized(scope, self.ctx.token) or (not self.ctx.token and client not in ("127.0.0.1", "::1")):
            await _send(send, scope, _status_reply(HttpError(401, "missing or wrong bearer token"), _reply_media(scope)))
            return
        if handler is None:
            await _send(send, scope, _status_reply(HttpError(404, "this server holds no store file to rewrite")))
            return
        if scope["method"] != "POST":
            await _send(send, scope, _status_reply(HttpError(405, f"use POST for {path}")))
            return
        await self._run_on_body(scope, receive, send, handler, what)

    async def _run_on_body(self, scope: dict[str, Any], receive: Any, send: Any, handler: Any, what: str) -> None:
        """Read a JSON request body within the limits and answer what ``handler(body)`` returns (status,
        content type, bytes), run on the read threads; a failure is a 500 and the server goes on."""
        try:
            body, reserved = await read_body(scope, receive, self.limits, self.budget, _QUERY_BODY_LIMIT)
        except ClientGone:
            return
        except HttpError as exc:
            await _send(send, scope, _Reply(exc.status, orjson.dumps({"error": str(exc)}), JSON,
                                            {"connection": "close"} if exc.close else {}))
            return
        try:
            status, content_type, out = await asyncio.get_running_loop().run_in_executor(self.reads, handler, body)
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            status, content_type, out = 500, JSON, orjson.dumps({"error": f"{what} failed: {exc}"})
        finally:
            self.budget.give(reserved)
        await _send(send, scope, _Reply(status, out, content_type))

    async def not_found(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or await self._over_limit(scope, receive, send):
            return
        media = _reply_media(scope)
        if not authorized(scope, self.ctx.token):
            reply = _status_reply(HttpError(401, "missing or wrong bearer token"), media)
        else:
            reply = _status_reply(HttpError(404, f"no route {scope['path']}"), media)
        await _send(send, scope, reply)

    # -- exports ------------------------------------------------------------------------------

    def export_route(self, signal: str) -> Callable[..., Any]:
        async def export(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await self.export(signal, scope, receive, send)

        return export

    async def export(self, signal: str, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await self._over_limit(scope, receive, send):
            return
        start = time.perf_counter()
        ctx = self.ctx
        media = _reply_media(scope)
        if scope["method"] != "POST":
            if not authorized(scope, ctx.token):
                await _send(send, scope, _status_reply(HttpError(401, "missing or wrong bearer token"), media))
            else:
                await _send(send, scope, _status_reply(HttpError(405, f"use POST for {scope['path']}"), media))
            return
        loop = asyncio.get_running_loop()
        reserved = 0
        try:
            if not authorized(scope, ctx.token):
                raise HttpError(401, "missing or wrong bearer token")
            try:
                media = media_type(header(scope, b"content-type"))
            except UnsupportedMediaType as exc:
                raise HttpError(415, str(exc)) from None
            # refuse before reading a body we cannot queue (waiting, if at all, in a pool thread)
            pipeline = ctx.service.pipeline
            if not pipeline.admits_now():
                await loop.run_in_executor(self.ingest, pipeline.check_admission)
            raw, reserved = await read_body(scope, receive, self.limits, self.budget)
            reply = await loop.run_in_executor(
                self.ingest, self._export_blocking, signal, raw, header(scope, b"content-encoding"), media, start)
        except ClientGone:
            timed_out = scope.get(TIMED_OUT, False)  # the connection answered 408 (and counted it)
            if not timed_out:
                ctx.metrics.inc("agenttape_http_refused_total", reason="truncated_body")
            ctx.metrics.inc("agenttape_requests_total", transport="http", signal=signal,
                            code="408" if timed_out else "499")
            return
        except HttpError as exc:
            reply = _status_reply(exc, media)
        except Backpressure as exc:
            status = 503 if exc.unavailable else 429
            reply = _status_reply(HttpError(status, str(exc), exc.retry_after), media)
        finally:
            if reserved:
                self.budget.give(reserved)
        ctx.metrics.inc("agenttape_requests_total", transport="http", signal=signal, code=str(reply.status))
        await _send(send, scope, reply)

    def _export_blocking(self, signal: str, raw: bytes, encoding: str | None, media: str, start: float) -> _Reply:
        """Decompress, prepare and make durable one request (in a pool thread); the reply for the client."""
        ctx = self.ctx
        try:
            body = decompress(raw, encoding, self.limits.max_body)
            del raw
            resp = ctx.service.export(signal, body, media)
            reply = _Reply(200, encode_message(resp, media), media)
            ctx.metrics.observe("agenttape_ingest_latency_seconds", time.perf_counter() - start)
            return reply
        except UnsupportedMediaType as exc:
            return _status_reply(HttpError(415, str(exc)), media)
        except BodyTooLarge as exc:
            return _status_reply(HttpError(413, str(exc)), media)
        except DecodeError as exc:
            return _status_reply(HttpError(400, str(exc)), media)
        except Backpressure as exc:
            status = 503 if exc.unavailable else 429
            return _status_reply(HttpError(status, str(exc), exc.retry_after), media)
        except (WalClosed, OSError) as exc:
            log.error("cannot make a request durable: %s", exc)
            return _status_reply(HttpError(503, f"cannot store the request now: {exc}", 5.0), media)


def build_app(ctx: HttpContext, limits: Limits, extra_routes: Sequence[BaseRoute] = (),
              fallback: Any = None) -> tuple[Starlette, _App]:
    """The Starlette application of the receiver, with the caller's routes and fallback (see module doc)."""
    app = _App(ctx, limits)
    # a function is a request/response endpoint to Starlette: ours are wrapped so they stay raw ASGI
    routes: list[BaseRoute] = [
        Route("/v1/traces", _Asgi(app.export_route(TRACES))),
        Route("/v1/logs", _Asgi(app.export_route(LOGS))),
        Route("/healthz", _Asgi(app.healthz)),
        Route("/metrics", _Asgi(app.metrics)),
        Route("/api/query", _Asgi(app.query)),
        Route("/api/erase", _Asgi(app.erase)),
        Route("/api/retain", _Asgi(app.retain)),
    ]
    starlette = Starlette(routes=[*routes, *extra_routes])
    starlette.router.redirect_slashes = False
    starlette.router.default = fallback if fallback is not None else app.not_found
    return starlette, app


class _Asgi:
    """An ASGI callable Starlette passes requests to unchanged."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.fn(scope, receive, send)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class HttpReceiver:
    """The HTTP listener, served by uvicorn from a background thread (see the module docstring)."""

    def __init__(self, host: str, port: int, ctx: HttpContext, extra_routes: Sequence[BaseRoute] = (),
                 fallback: Any = None) -> None:
        self.limits = ctx.limits or Limits(max_body=ctx.max_body)
        self.ctx = ctx
        self._sock = _bind(host, port)
        self.port = self._sock.getsockname()[1]
        self.app, self._app = build_app(ctx, self.limits, extra_routes, fallback)
        refused = lambda reason: ctx.metrics.inc("agenttape_http_refused_total", reason=reason)  # noqa: E731
        config = uvicorn.Config(
            self.app, http=protocol_class(self.limits, refused), lifespan="off", interface="asgi3",
            log_config=None, access_log=False, proxy_headers=False, server_header=False,
            headers=[("server", "agenttape")], timeout_keep_alive=int(math.ceil(self.limits.idle_timeout)),
            timeout_graceful_shutdown=10, ws="none",
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def connections(self) -> int:
        """Open HTTP connections."""
        return len(self._server.server_state.connections)

    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
            log.error("the HTTP server stopped: %s", exc)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agenttape-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the HTTP server did not start: {self._error}")
            time.sleep(0.005)

    def stop(self) -> None:
        """Stop accepting, finish the requests in progress (10 s at most), close every connection."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=20)
        self._app.close()
        self._sock.close()
