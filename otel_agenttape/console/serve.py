"""Serve the console alone (``agenttape console``): open a store, a lake or OTLP files read-only, run uvicorn.

The console shows content before redaction, so without a token it binds loopback addresses only,
unless told ``insecure_no_auth``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_PORT = 4380


class ConsoleError(Exception):
    """The console cannot start; the message is meant for the user."""


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback address."""
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def check_bind(host: str, token: str | None, insecure_no_auth: bool = False) -> None:
    """Refuse to expose tape content beyond this machine without a token."""
    if token or insecure_no_auth or is_loopback(host):
        return
    raise ConsoleError(f"refusing to serve the console on {host} without a token: tapes hold content before "
                       f"redaction. Give --token (or AGENTTAPE_TOKEN), bind 127.0.0.1, or pass --insecure-no-auth")


def open_tapes(db: str | None = None, lake: str | None = None, files: Sequence[str] | None = None) -> Any:
    """The read model over OTLP files, a Parquet lake or a DuckDB file (through its server when one holds it)."""
    import otel_agenttape
    from otel_agenttape.store.reader import StoreError

    source: Any = list(files) if files else lake or db
    if not source:
        raise ConsoleError("no source: give --db PATH, --lake DIR or OTLP files")
    if lake and not os.path.isdir(lake):
        raise ConsoleError(f"no Parquet lake at {lake}")
    try:
        return otel_agenttape.open(source)
    except (OSError, ValueError, StoreError) as exc:
        raise ConsoleError(str(exc)) from None


def make_server(app: Any, host: str, port: int) -> Any:
    """A uvicorn server for ``app`` (not started): quiet access log; SIGINT/SIGTERM end it gracefully and
    the process then goes on (uvicorn itself re-raises the signal, which would skip the caller's cleanup)."""
    import contextlib
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=5)
    return Server(config)


def bound_url(server: Any) -> str:
    """``http://host:port`` of a started uvicorn server (the real port when asked for port 0)."""
    sock = server.servers[0].sockets[0]
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def serve(tapes: Any, host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: str | None = None,
          insecure_no_auth: bool = False, on_ready: Callable[[str], None] | None = None,
          annotations: Any = None) -> None:
    """Serve the console in the foreground until SIGINT/SIGTERM; ``on_ready(url)`` once it listens.
    ``annotations``: take people's scores (``console.annotate.Annotations``)."""
    import asyncio

    from .app import create_app

    check_bind(host, token, insecure_no_auth)
    server = make_server(create_app(tapes, token=token, annotations=annotations), host, port)

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            if task.done():
                await task
                raise ConsoleError(f"cannot listen on {host}:{port}")
            await asyncio.sleep(0.02)
        if on_ready is not None:
            on_ready(bound_url(server))
        await task

    try:
        asyncio.run(main())
    except SystemExit as exc:  # uvicorn exits when it cannot bind
        raise ConsoleError(f"cannot listen on {host}:{port}") from exc


class _LazyTapes:
    """The read model over a receiver's own store, opened at the first read (the store exists only once
    the receiver has started, after the app is built)."""

    def __init__(self, store: Callable[[], Any]) -> None:
        self._store = store
        self._tapes: Any = None
        self._lock = threading.Lock()

    def _open(self) -> Any:
        with self._lock:
            if self._tapes is None:
                import otel_agenttape

                store = self._store()
                if store is None:
                    raise ConsoleError("the receiver has not opened its store yet")
                self._tapes = otel_agenttape.open(store)
            return self._tapes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._open(), name)


def receiver_app(store: Callable[[], Any], token: str | None, annotations: Any = None) -> Any:
    """The console as the fallback app of ``agenttape serve``'s HTTP port: ``/`` and ``/api/...`` over the
    store the receiver writes (``store`` returns it once the receiver has started), gated by ``token``;
    ``annotations`` take people's scores."""
    from .app import create_app

    return create_app(_LazyTapes(store), token=token, annotations=annotations)


def annotations_for(annotate_token: str | None, read_token: str | None, endpoint: str | Callable[[], str] | None,
                    receiver_token: str | None = None) -> Any:
    """The ``Annotations`` of ``--annotate-token`` (None without one): scores sent to ``endpoint``, the
    receiver's OTLP/HTTP URL. ``ConsoleError`` when the token is the read token or nothing receives."""
    if not annotate_token:
        return None
    if read_token and annotate_token == read_token:
        raise ConsoleError("--annotate-token must differ from --token: reading and annotating are separate rights")
    if not endpoint:
        raise ConsoleError("--annotate-token needs a receiver to record annotations: give --annotate-endpoint "
                           "URL (or OTEL_EXPORTER_OTLP_ENDPOINT), or serve the store with agenttape serve")
    from .annotate import Annotations

    headers = {"authorization": f"Bearer {receiver_token}"} if receiver_token else None
    return Annotations(annotate_token, endpoint, headers=headers, outbox=os.environ.get("AGENTTAPE_OUTBOX") or None)
