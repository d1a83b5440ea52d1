"""The console as a Starlette app: the page at ``/``, its assets under ``/static/``, the read API under ``/api/``.

``create_app(tapes, token=...)`` holds no global state, so it can be served alone (``agenttape console``)
or mounted into another Starlette app, for example beside the receiver's OTLP routes::

    from starlette.routing import Mount
    routes.append(Mount("/", app=create_app(otel_agenttape.open("tapes.duckdb"), token=token)))

With a token, every ``/api/`` request needs ``Authorization: Bearer TOKEN``; the page and its assets
hold no tape content and load without it (the page asks for the token and keeps it for the browser
session). Responses forbid inline script and every origin but this one (CSP), a second guard behind
the page's rule of rendering content as text.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from otel_agenttape.store.rewrite_gate import StoreBusy
from otel_agenttape.tape.refs import AmbiguousRunError, RunNotFound

from . import api
from .annotate import ANNOTATE_HEADER

STATIC = Path(__file__).resolve().parent / "static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=str, option=orjson.OPT_NON_STR_KEYS)


def _error(status: int, message: str, **extra: Any) -> JSON:
    return JSON({"error": message, **extra}, status_code=status)


class _Headers:
    """Adds the security headers to every response of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, sending)


class _TokenGate:
    """Refuses every ``/api/`` request without ``Authorization: Bearer TOKEN`` (the page itself is public)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is not None and scope["type"] == "http" and scope["path"].startswith("/api/"):
            given = b""
            for name, value in scope.get("headers", []):
                if name == b"authorization" and value[:7].lower() == b"bearer ":
                    given = value[7:].strip()
            if not hmac.compare_digest(given, self.token):
                response = _error(401, "this console needs its token: Authorization: Bearer TOKEN")
                response.headers["www-authenticate"] = 'Bearer realm="agenttape"'
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(tapes: Any, token: str | None = None, *, on_shutdown: Callable[[], None] | None = None,
               debug: bool = False, annotations: Any = None) -> Starlette:
    """The console over ``tapes`` (the read model ``otel_agenttape.open`` returns).

    ``token``: required as a bearer token on every ``/api/`` read. Read calls run one at a time in a
    worker thread (a DuckDB connection serves one query at a time); the event loop stays free.
    ``annotations`` (``console.annotate.Annotations``): accept scores from people holding its token at
    ``POST /api/runs/{ref}/scores``; None: the console only reads.
    """
    lock = threading.Lock()

    async def call(fn: Callable[..., Any], *args: Any) -> Response:
        def locked() -> Any:
            with lock:
                return fn(tapes, *args)

        try:
            return JSON(await anyio.to_thread.run_sync(locked))
        except api.BadRequest as exc:
            return _error(400, str(exc))
        except AmbiguousRunError as exc:
            return _error(409, str(exc), candidates=list(getattr(exc, "candidates", []) or []))
        except (RunNotFound, api.NotFound) as exc:
            return _error(404, str(exc))
        except (ValueError, KeyError) as exc:
            return _error(400, str(exc))
        except StoreBusy as exc:  # the receiver rewrites its file (an erasure, retention) past a read's wait
            response = _error(503, str(exc))
            response.headers["retry-after"] = str(int(exc.retry_after))
            return response

    def ref_of(request: Request) -> str:
        return request.path_params["ref"]

    async def runs(request: Request) -> Response:
        return await call(api.runs_page, dict(request.query_params))

    async def run(request: Request) -> Response:
        return await call(api.run_summary, ref_of(request))

    async def steps(request: Request) -> Response:
        return await call(api.steps, ref_of(request))

    async def nodes(request: Request) -> Response:
        return await call(api.nodes, ref_of(request))

    async def spans(request: Request) -> Response:
        return await call(api.timeline, ref_of(request))

    async def otlp(request: Request) -> Response:
        response = await call(api.otlp, ref_of(request))
        if response.status_code == 200:
            safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in ref_of(request))[:120]
            response.headers["content-disposition"] = f'attachment; filename="{safe}.otlp.json"'
        return response

    async def replay(request: Request) -> Response:
        tree = request.query_params.get("tree", "") not in ("", "0", "false")
        return await call(api.replay, ref_of(request), tree)

    async def tree(request: Request) -> Response:
        return await call(api.tree, ref_of(request))

    async def session(request: Request) -> Response:
        return await call(api.session, request.path_params["session_id"])

    async def diff(request: Request) -> Response:
        return await call(api.diff, request.query_params.get("a"), request.query_params.get("b"))

    async def experiments(request: Request) -> Response:
        return await call(api.experiments)

    async def experiment(request: Request) -> Response:
        return await call(api.experiment, request.path_params["name"], dict(request.query_params),
                          request.query_params.getlist("eval"))

    async def verify(request: Request) -> Response:
        return await call(api.verify, request.query_params.get("tape"))

    async def info(request: Request) -> Response:
        return JSON(api.info(tapes, token is not None, annotations is not None))

    async def scores(request: Request) -> Response:
        if request.method == "GET":
            return await call(api.run_scores, ref_of(request))
        if annotations is None:
            return _error(403, "this console does not take annotations: start it with --annotate-token")
        if not annotations.allowed(request.headers.get(ANNOTATE_HEADER)):
            return _error(403, f"annotating needs the annotate token in the {ANNOTATE_HEADER} header")
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _error(400, "the body is not JSON")
        # recorded outside the read lock: the wait for the receiver must not hold other readers up
        try:
            return JSON(await anyio.to_thread.run_sync(annotations.record, tapes, ref_of(request), body))
        except AmbiguousRunError as exc:
            return _error(409, str(exc), candidates=list(getattr(exc, "candidates", []) or []))
        except RunNotFound as exc:
            return _error(404, str(exc))
        except ValueError as exc:
            return _error(400, str(exc))

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})

    async def api_missing(request: Request) -> Response:
        return _error(404, f"no such endpoint: {request.url.path}")

    def shutdown() -> None:
        if on_shutdown is not None:
            on_shutdown()

    routes = [
        Route("/", page),
        Route("/api/info", info),
        Route("/api/runs", runs),
        Route("/api/runs/{ref}", run),
        Route("/api/runs/{ref}/steps", steps),
        Route("/api/runs/{ref}/nodes", nodes),
        Route("/api/runs/{ref}/spans", spans),
        Route("/api/runs/{ref}/otlp", otlp),
        Route("/api/runs/{ref}/replay", replay),
        Route("/api/runs/{ref}/tree", tree),
        Route("/api/runs/{ref}/scores", scores, methods=["GET", "POST"]),
        Route("/api/sessions/{session_id}", session),
        Route("/api/diff", diff),
        Route("/api/experiments", experiments),
        Route("/api/experiments/{name}", experiment),
        Route("/api/verify", verify),
        Route("/api/{rest:path}", api_missing),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
    ]
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        if annotations is not None:
            annotations.close()
        shutdown()

    return Starlette(debug=debug, routes=routes, lifespan=lifespan,
                     middleware=[Middleware(_Headers), Middleware(_TokenGate, token=token)])
