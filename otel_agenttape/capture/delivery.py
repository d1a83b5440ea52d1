"""Requests bounded in bytes, and their delivery: split on "too large", retry with backoff within a
deadline, and say exactly what became of every span (delivered, kept for later, refused, too large).

Both OTLP exporters (``otlp_exporters``) send through ``deliver``; the outbox re-sends its records
through it too. A request is never larger than ``max_request_bytes`` (default 4 MiB: the receivers'
usual limit is 4 MiB for gRPC, e.g. the OpenTelemetry Collector's, and ``agenttape serve`` takes
20 MiB); a receiver that still answers 413 / RESOURCE_EXHAUSTED gets the request in halves, and a
single span over the limit is dropped and counted (``spans_dropped_too_large``).
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan

from otel_agenttape.codec.otlp_encode import encode_trace_request

DEFAULT_MAX_REQUEST_BYTES = 4 << 20
_log = logging.getLogger(__name__)
_WARN_EVERY_S = 60.0


class Outcome(enum.Enum):
    OK = "ok"                # acknowledged
    TOO_LARGE = "too_large"  # 413 / RESOURCE_EXHAUSTED for the size: send it in halves
    RETRY = "retry"          # transient (refused connection, timeout, 429, 5xx, UNAVAILABLE): try again
    KEEP = "keep"            # not now, but keep it (401/403: the token may be fixed)
    REFUSED = "refused"      # the receiver will never take it (400): counted, not kept


@dataclass
class Sent:
    """What one delivery did: spans acknowledged, requests to keep (undelivered), spans refused or too large."""

    delivered: int = 0
    rejected: int = 0  # partial success: acknowledged requests whose spans the receiver rejected
    refused: int = 0
    too_large: int = 0
    splits: int = 0
    undelivered: list[tuple[bytes, int]] = field(default_factory=list)
    routed: bool = False  # not tried: queued behind the outbox's records

    @property
    def kept(self) -> int:
        return sum(n for _, n in self.undelivered)


SendOnce = Callable[[bytes, float], tuple[Outcome, int, str]]  # (data, timeout) -> (outcome, rejected, why)


def encode_bounded(spans: Sequence[ReadableSpan], max_bytes: int,
                   encode: Callable[[Sequence[ReadableSpan]], bytes] = encode_trace_request,
                   ) -> tuple[list[tuple[bytes, int]], int]:
    """``([(request bytes, span count)], spans too large)``: requests of at most ``max_bytes`` each, in order."""
    out: list[tuple[bytes, int]] = []
    too_large = 0
    stack = [list(spans)]
    while stack:
        part = stack.pop()
        if not part:
            continue
        data = encode(part)
        if max_bytes <= 0 or len(data) <= max_bytes:
            out.append((data, len(part)))
        elif len(part) == 1:
            too_large += 1
            _warn_too_large(len(data), max_bytes)
        else:
            mid = len(part) // 2
            stack.append(part[mid:])
            stack.append(part[:mid])
    return out, too_large


def split_request(data: bytes) -> list[tuple[bytes, int]]:
    """A serialized trace request as two (same resources and scopes, half of the spans each)."""
    req = ExportTraceServiceRequest.FromString(data)
    flat = [(ri, si, span) for ri, rs in enumerate(req.resource_spans)
            for si, ss in enumerate(rs.scope_spans) for span in ss.spans]
    if len(flat) < 2:
        return [(data, len(flat))]
    mid = len(flat) // 2
    return [(_rebuild(req, flat[:mid]), mid), (_rebuild(req, flat[mid:]), len(flat) - mid)]


def _rebuild(req: ExportTraceServiceRequest, part: list) -> bytes:
    out = ExportTraceServiceRequest()
    where: dict[tuple[int, int], object] = {}
    rmap: dict[int, object] = {}
    for ri, si, span in part:
        if ri not in rmap:
            src = req.resource_spans[ri]
            rs = out.resource_spans.add()
            rs.resource.CopyFrom(src.resource)
            rs.schema_url = src.schema_url
            rmap[ri] = rs
        key = (ri, si)
        if key not in where:
            src_ss = req.resource_spans[ri].scope_spans[si]
            ss = rmap[ri].scope_spans.add()  # type: ignore[attr-defined]
            ss.scope.CopyFrom(src_ss.scope)
            ss.schema_url = src_ss.schema_url
            where[key] = ss
        where[key].spans.add().CopyFrom(span)  # type: ignore[attr-defined]
    return out.SerializeToString()


def count_spans(data: bytes) -> int:
    req = ExportTraceServiceRequest.FromString(data)
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


def deliver(requests: list[tuple[bytes, int]], send_once: SendOnce, *, timeout: float, retry: bool,
            stop: threading.Event | None = None,
            split: Callable[[bytes], list[tuple[bytes, int]]] | None = None) -> Sent:
    """Send the requests in order within ``timeout`` seconds in total.

    ``retry``: retry transient failures with backoff (1 s, 2 s, 4 s... with jitter) until the
    deadline; else one attempt each. After a request could not be delivered, the ones behind it are
    not tried (the receiver is down) and are returned in ``undelivered`` with it. ``split`` halves a
    request the receiver found too large (default: a trace request's ``split_request``).
    """
    split = split_request if split is None else split
    sent = Sent()
    deadline = time.monotonic() + timeout
    todo = list(requests)
    while todo:
        data, n = todo.pop(0)
        outcome, rejected = _attempt(data, send_once, deadline, retry, stop)
        if outcome is Outcome.OK:
            sent.delivered += n
            sent.rejected += rejected
        elif outcome is Outcome.TOO_LARGE:
            halves = split(data) if n > 1 else []
            if len(halves) == 2:
                sent.splits += 1
                todo[:0] = halves
            else:
                sent.too_large += n
                _warn_too_large(len(data), None)
        elif outcome is Outcome.REFUSED:
            sent.refused += n
        else:
            sent.undelivered.append((data, n))
            sent.undelivered.extend(todo)
            break
    return sent


def _attempt(data: bytes, send_once: SendOnce, deadline: float, retry: bool,
             stop: threading.Event | None) -> tuple[Outcome, int]:
    backoff = 1.0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Outcome.RETRY, 0
        try:
            outcome, rejected, why = send_once(data, remaining)
        except Exception as exc:  # noqa: BLE001 - a transport failure is a failed attempt, never raised
            outcome, rejected, why = Outcome.RETRY, 0, f"{type(exc).__name__}: {exc}"
        if outcome is not Outcome.RETRY or not retry:
            if outcome is not Outcome.OK:
                _log.debug("export: %s (%s)", outcome.value, why)
            if outcome is Outcome.REFUSED:
                _log.warning("the OTLP receiver refused a request: %s", why)
            return outcome, rejected
        wait = backoff * random.uniform(0.8, 1.2)
        if wait >= deadline - time.monotonic():
            return Outcome.RETRY, 0
        _log.debug("export failed (%s), retrying in %.1f s", why, wait)
        if stop is not None:
            if stop.wait(wait):
                return Outcome.RETRY, 0
        else:
            time.sleep(wait)
        backoff *= 2


_warned_at = [-_WARN_EVERY_S]


def _warn_too_large(size: int, limit: int | None) -> None:
    now = time.monotonic()
    if now - _warned_at[0] >= _WARN_EVERY_S:
        _warned_at[0] = now
        _log.warning("dropping a span of %d bytes: it exceeds the request size limit%s (counted in "
                     "spans_dropped_too_large)", size, f" of {limit} bytes" if limit else " of the receiver")
