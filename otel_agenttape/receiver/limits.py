"""The receiver's per-request and per-connection limits, in one place: the CLI flags, ``TapeServer``
and the docs' table all read these defaults.

A limit exists so that one client, or one request, cannot take the memory, the threads or the
connections that every other client needs; each one refuses with an answer the client can act on
(see docs/operations.md, "Limits and backpressure").
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BODY = 20 * 1024 * 1024
# Spans (or log records) in one request. Converting a span to rows takes about 1 KB of memory even
# when it is empty on the wire (2 bytes), so a body limit alone does not bound a request's memory:
# 20 MiB of tiny spans is 700,000 of them. OpenTelemetry SDKs send 512 per request by default, the
# Collector's batch processor 8,192.
DEFAULT_MAX_SPANS_PER_REQUEST = 100_000
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_HEADER_TIMEOUT = 10.0  # from a request's first byte to the end of its headers
DEFAULT_BODY_TIMEOUT = 60.0  # from the end of the headers to the end of the body
DEFAULT_IDLE_TIMEOUT = 60.0  # a kept-alive connection with no request (SDKs export every 5 s)
# After answering a request whose body it did not read, a closing connection sends its answer and a
# FIN, then reads and drops what the client still sends (a lingering close, as nginx's): closing at
# once with unread bytes makes the kernel send a reset, and the client loses the answer.
DEFAULT_LINGER_TIME = 30.0  # seconds a closing connection reads and drops at most (nginx's lingering_time)
DEFAULT_LINGER_IDLE = 5.0  # seconds it waits for the next bytes (nginx's lingering_timeout)
DEFAULT_LINGER_BYTES = 1024 * 1024 * 1024  # bytes it reads and drops at most


@dataclass(frozen=True)
class Limits:
    """What one request and one connection may take; see the module docstring."""

    max_body: int = DEFAULT_MAX_BODY
    max_spans_per_request: int = DEFAULT_MAX_SPANS_PER_REQUEST
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    linger_time: float = DEFAULT_LINGER_TIME
    linger_idle: float = DEFAULT_LINGER_IDLE
    linger_bytes: int = DEFAULT_LINGER_BYTES

    def __post_init__(self) -> None:
        for name in ("max_body", "max_spans_per_request", "max_connections", "linger_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("header_timeout", "body_timeout", "idle_timeout", "linger_time", "linger_idle"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0 seconds")

    @property
    def inflight_bytes(self) -> int:
        """Request bodies held in memory at once, over all connections (reading, or waiting for a thread)."""
        return 4 * self.max_body

    @property
    def drain_bytes(self) -> int:
        """How much of a refused body is read and dropped while the connection stays usable for the
        next request; a longer declared body gets the answer and a lingering close (``linger_*``)."""
        return max(4 * self.max_body, 64 * 1024 * 1024)
