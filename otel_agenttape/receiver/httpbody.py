"""Reading an OTLP/HTTP request body under the receiver's limits, on the event loop.

The framing itself (chunked decoding, ``Content-Length`` against the bytes received, one of the
two) is llhttp's, through uvicorn; this module decides what a body may be before it is read:
at most ``max_body`` bytes, a transfer coding the receiver understands, and a share of the bytes
all requests may hold in memory at once (``BodyBudget``), so many large requests arriving
together wait or get 429 instead of taking the process's memory. A client that goes away before
its body is complete raises ``ClientGone``: nothing of such a request is stored or answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from otel_agenttape.receiver.limits import Limits

_BUDGET_WAIT = 2.0  # seconds a request waits for its share of the in-flight bytes before a 429


class HttpError(Exception):
    """An answer other than 200; ``close`` ends the connection after it (the body is not read)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.close = close


class ClientGone(Exception):
    """The client closed the connection before its request was complete."""


class BodyBudget:
    """Bytes of request bodies held at once, over all connections (used on the event loop only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._freed: asyncio.Event | None = None

    async def take(self, n: int, wait: float = _BUDGET_WAIT) -> bool:
        """Reserve ``n`` bytes, waiting up to ``wait`` seconds for other requests to give theirs back."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while self.used and self.used + n > self.limit:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._freed is None:
                self._freed = asyncio.Event()
            try:
                await asyncio.wait_for(self._freed.wait(), remaining)
            except TimeoutError:
                return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n
        if self._freed is not None:
            self._freed.set()
            self._freed = None


def header(scope: dict[str, Any], name: bytes) -> str | None:
    """The value of a request header (the last one when repeated), or None."""
    value = None
    for k, v in scope["headers"]:
        if k == name:
            value = v
    return None if value is None else value.decode("latin-1")


def declared_length(scope: dict[str, Any]) -> int | None:
    """The body's framing, checked before any of it is read: its ``Content-Length``, or None for chunked.

    llhttp already refuses ``Content-Length`` with ``Transfer-Encoding`` and differing lengths; the
    checks here hold whatever parser is underneath (RFC 9112 section 6.3: a request with both is
    refused, and a transfer coding the server does not know gets 501)."""
    length = header(scope, b"content-length")
    coding = header(scope, b"transfer-encoding")
    if coding is not None:
        if length is not None:
            raise HttpError(400, "Content-Length and Transfer-Encoding together are refused (RFC 9112)", close=True)
        if coding.strip().lower() != "chunked":
            raise HttpError(501, f"unsupported Transfer-Encoding {coding!r}; use chunked", close=True)
        return None
    if length is None:
        raise HttpError(411, "Content-Length or chunked Transfer-Encoding required", close=True)
    if not length.strip().isdigit():
        raise HttpError(400, "invalid Content-Length", close=True)
    return int(length)


async def read_body(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    limits: Limits,
    budget: BodyBudget,
    limit: int | None = None,
) -> tuple[bytes, int]:
    """The whole body of a request, and the bytes reserved in ``budget`` for it (give them back).

    Raises ``HttpError`` (413 over the limit, 429 when the budget stays full, framing errors) and
    ``ClientGone``. The body timeout is enforced by the connection (``httpproto``)."""
    limit = limits.max_body if limit is None else limit
    n = declared_length(scope)
    if n is not None and n > limit:
        raise HttpError(413, f"request body of {n} bytes exceeds the limit of {limit} bytes",
                        close=n > limits.drain_bytes or _expects_continue(scope))
    reserved = limit if n is None else n
    if not await budget.take(reserved):
        raise HttpError(429, "too many request bodies in flight; retry later", retry_after=1.0,
                        close=_expects_continue(scope))
    try:
        parts: list[bytes] = []
        total = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ClientGone("the client closed the connection before the body was complete")
            chunk = msg.get("body", b"")
            if chunk:
                total += len(chunk)
                if total > limit:
                    raise HttpError(413, f"request body exceeds the limit of {limit} bytes")
                parts.append(chunk)
            if not msg.get("more_body", False):
                break
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        if n is None:  # chunked: keep only what arrived reserved
            budget.give(reserved - len(body))
            reserved = len(body)
        return body, reserved
    except BaseException:
        budget.give(reserved)
        raise


async def discard_body(receive: Callable[[], Awaitable[dict[str, Any]]], limit: int) -> None:
    """Read and drop up to ``limit`` bytes of body, so an answer sent before closing is read, not reset."""
    total = 0
    while total <= limit:
        msg = await receive()
        if msg["type"] == "http.disconnect" or not msg.get("more_body", False):
            return
        total += len(msg.get("body", b""))


def _expects_continue(scope: dict[str, Any]) -> bool:
    """A client waiting for ``100 Continue`` never sends a body we refuse first: close, or the
    connection would read its next request as that body."""
    return (header(scope, b"expect") or "").lower() == "100-continue"
