"""The HTTP/1.1 connection: uvicorn's httptools protocol with the deadlines and bounds it lacks.

uvicorn parses requests (llhttp refuses malformed framing, e.g. ``Content-Length`` together with
``Transfer-Encoding``) and closes idle keep-alive connections, but waits forever for a request's
headers or body once its first byte came in: a client trickling one byte at a time would hold its
connection for good. This protocol gives every phase of a connection a deadline (past the header
or body deadline the client gets a 408, and the connection is closed):

- waiting for a request on a kept-alive connection: ``idle_timeout``;
- from a request's first byte to the end of its headers: ``header_timeout``;
- from the end of the headers to the end of the body: ``body_timeout``;
- the rest of a body the application refused without reading it (413, 401...) is read and
  dropped, so the client gets to read the answer instead of a reset, up to ``drain_bytes`` and
  ``body_timeout``, and the connection serves the next request;
- a connection that closes while a request's body is still arriving (the client sent
  ``Connection: close``, the declared body is past ``drain_bytes``, or a drain ran past it) closes
  lingering, as nginx does: the answer and a FIN go out, then whatever the client still sends is
  read and dropped, up to ``linger_bytes`` and ``linger_time`` (``linger_idle`` between reads),
  before the socket is closed. Closing at once with unread bytes in the socket makes the kernel
  answer with a reset, which destroys the answer in flight: the client would see "connection
  reset by peer" and could not tell "too large" from "receiver down". Lingering reads into the
  connection's one read buffer, so a refused body of any size costs no memory.

Past ``max_connections`` open connections, a new connection's requests are answered 503 with
``Retry-After`` and the connection closed (``scope["agenttape.over_limit"]`` tells the app).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from otel_agenttape.receiver.limits import Limits

log = logging.getLogger(__name__)

OVER_LIMIT = "agenttape.over_limit"  # scope key: this connection came in past max_connections
TIMED_OUT = "agenttape.timed_out"  # scope key: the connection answered 408 while the app read the body
_READ_BUFFER = 256 * 1024  # bytes asyncio reads at once (into one buffer kept per connection)
_HIGH_WATER = 4 * 1024 * 1024  # body bytes buffered per connection before reading pauses for the app


class _Chunks:
    """A request body's chunks not yet taken by the app; ``bytes()`` joins them (uvicorn's receive()
    calls it, then starts a new buffer)."""

    __slots__ = ("parts", "size")

    def __init__(self, first: bytes = b"") -> None:
        self.parts = [first] if first else []
        self.size = len(first)

    def add(self, chunk: bytes) -> None:
        self.parts.append(chunk)
        self.size += len(chunk)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        parts = self.parts
        return parts[0] if len(parts) == 1 else b"".join(parts)


class _LingeringTransport:
    """The transport a request's cycle writes to: its ``close()`` is the connection's lingering close
    (uvicorn's cycle closes the transport itself once a response with ``Connection: close`` is sent)."""

    __slots__ = ("_protocol", "_transport")

    def __init__(self, protocol: BoundedProtocol, transport: asyncio.Transport) -> None:
        self._protocol = protocol
        self._transport = transport

    def close(self) -> None:
        self._protocol.close_lingering()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BoundedProtocol(HttpToolsProtocol, asyncio.BufferedProtocol):
    """One connection; ``limits`` and ``on_refused(reason)`` are set on a subclass by ``protocol_class``."""

    limits: Limits = Limits()
    on_refused: Callable[[str], None] = staticmethod(lambda reason: None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase = "idle"
        self._drained = 0
        self._over_limit = False
        self._read_view: memoryview | None = None
        self._lingering = False
        self._linger_left = 0  # bytes a lingering close still reads and drops
        self._linger_end = 0.0  # loop time a lingering close ends at

    # -- deadlines ----------------------------------------------------------------------------

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(seconds, self._expired, phase)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, phase: str) -> None:
        self._deadline = None
        if self.transport is None or self.transport.is_closing():
            return
        if phase != "idle":  # an idle keep-alive connection closing is routine; the others are not
            log.info("closing an HTTP connection from %s: %s timeout", self.client, phase)
            self.on_refused(f"{phase}_timeout")
            cycle = self.cycle
            if phase == "header" or (phase == "body" and cycle is not None and not cycle.response_started):
                self._send_408(phase)
        self.transport.close()

    def _send_408(self, phase: str) -> None:
        """Tell a slow client why it is cut off (a google.rpc.Status, DEADLINE_EXCEEDED), then close."""
        seconds = self.limits.header_timeout if phase == "header" else self.limits.body_timeout
        self._write_status(408, 4, f"request {phase} not received within {seconds:g} s")
        cycle = self.cycle
        if cycle is not None and phase == "body":
            cycle.response_started = cycle.response_complete = True  # the app's receive() sees a disconnect
            cycle.scope[TIMED_OUT] = True  # type: ignore[typeddict-unknown-key]

    def _write_status(self, status: int, code: int, message: str) -> None:
        """An answer written by the connection itself (no request reached the app): JSON
        ``google.rpc.Status``, then the connection closes."""
        body = orjson.dumps({"code": code, "message": message})
        reason = {400: b"Bad Request", 408: b"Request Timeout"}[status]
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))

    # -- connection ---------------------------------------------------------------------------

    # asyncio reads into one buffer per connection instead of a new 256 KiB bytes per read
    def get_buffer(self, sizehint: int) -> memoryview:
        view = self._read_view
        if view is None:
            view = self._read_view = memoryview(bytearray(_READ_BUFFER))
        return view

    def buffer_updated(self, nbytes: int) -> None:
        if self._lingering:
            self._dropped(nbytes)
            return
        self.data_received(self._read_view[:nbytes])  # type: ignore[index, arg-type]

    # -- lingering close ----------------------------------------------------------------------

    def close_lingering(self) -> None:
        """Close after the answer; while the request's body is still arriving, linger (module doc)."""
        transport = self.transport
        if self._lingering or transport is None or transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or not cycle.more_body or not transport.can_write_eof():
            transport.close()  # nothing unread is on its way: a plain close sends no reset
            return
        self._lingering = True
        limits = self.limits
        self._linger_left = limits.linger_bytes
        self._linger_end = self.loop.time() + limits.linger_time
        transport.write_eof()  # asyncio sends what is buffered (the answer), then the FIN
        self.flow.resume_reading()
        self._arm("linger", min(limits.linger_idle, limits.linger_time))

    def _dropped(self, nbytes: int) -> None:
        """Bytes read while lingering: drop them; past the byte or time bound, close."""
        self._linger_left -= nbytes
        remaining = self._linger_end - self.loop.time()
        if self._linger_left < 0 or remaining <= 0:
            log.info("closing an HTTP connection from %s: linger limit", self.client)
            self.on_refused("linger_limit")
            self._disarm()
            self.transport.close()
            return
        self._arm("linger", min(self.limits.linger_idle, remaining))

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with llhttp's reason in the 400 (for instance "Transfer-Encoding can't be
        present with Content-Length") as a JSON ``google.rpc.Status`` like every other error."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            log.info("refusing a malformed HTTP request from %s: %s", self.client, exc)
            self.on_refused("bad_request")
            self._disarm()
            self._write_status(400, 3, f"invalid HTTP request: {exc}")
            self.transport.close()
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # no upgrade is served; the deadlines close it

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._over_limit = len(self.connections) > self.limits.max_connections
        if self._over_limit:
            self.on_refused("max_connections")
        self._arm("idle", self.limits.header_timeout if self._over_limit else self.limits.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # -- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._drained = 0
        self._arm("header", self.limits.header_timeout)

    def on_headers_complete(self) -> None:
        if self._over_limit:
            self.scope[OVER_LIMIT] = True  # type: ignore[typeddict-unknown-key]
        super().on_headers_complete()
        self.cycle.transport = _LingeringTransport(self, self.transport)  # type: ignore[assignment]
        self._arm("body", self.limits.body_timeout)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle.response_complete:
            self._drained += len(body)
            if self._drained > self.limits.drain_bytes and not self._lingering:
                self.on_refused("drain_limit")
                self.close_lingering()
            return
        # uvicorn appends each chunk to a bytearray, copies it out per receive() and pauses reading
        # past 64 KiB: a 1 MB export body cost a dozen loop turns and four copies. The chunks are
        # kept as they came and joined once, when the body is complete (``bytes()`` of ``_Chunks``).
        buf = cycle.body
        if type(buf) is not _Chunks:
            buf = cycle.body = _Chunks(bytes(buf))  # type: ignore[assignment]
        buf.add(body)
        if buf.size > _HIGH_WATER:  # the app takes what is there; reading waits until it has
            self.flow.pause_reading()
            cycle.message_event.set()
        # else the app is woken when the body is complete (or the connection lost): one join

    def on_message_complete(self) -> None:
        response_done = self.cycle is not None and self.cycle.response_complete
        super().on_message_complete()
        if response_done:  # a refused body fully drained: the connection waits for the next request
            self._arm("idle", self.limits.idle_timeout)
        else:
            self._disarm()  # the request is complete; the app's work is bounded by the pipeline

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        if self._lingering or self.transport.is_closing() or cycle is None or not cycle.response_complete:
            return  # closing, or a pipelined request is being answered now
        if self._phase == "header" and self._deadline is not None:
            return  # the next request's head is arriving: its deadline stands
        if cycle.more_body:
            self._arm("drain", self.limits.body_timeout)  # the rest of a refused body
        else:
            self._arm("idle", self.limits.idle_timeout)

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's own keep-alive timer: ours (``idle``) decides instead."""


def protocol_class(limits: Limits, on_refused: Callable[[str], None]) -> type[BoundedProtocol]:
    """A ``BoundedProtocol`` for one server's limits (uvicorn builds protocols from a class)."""
    return type("AgenttapeHttpProtocol", (BoundedProtocol,),
                {"limits": limits, "on_refused": staticmethod(on_refused)})
