"""The official OTLP span exporters (HTTP and gRPC), with requests encoded by ``codec.otlp_encode`` and
delivered by ``delivery``.

The SDK exporters' own parts are kept: endpoint and header resolution, the ``OTEL_EXPORTER_OTLP_*``
variables, compression, TLS, the HTTP transport and gRPC channel, and their self-metrics. The wire
bytes are the same the SDK encoder produces (tests compare them); they cost about a third of the CPU.
Ours are the request size bound (``max_request_bytes``, split on 413), the retries (with backoff,
within the exporter's ``timeout``, ended at once by ``shutdown``) and the account of every span
(``deliver_spans``), which the export queue and the outbox read.

The SDK exporters have no public way to send bytes that are already encoded, so each exporter reaches
into three private parts, each checked once at construction (``sends_bytes``):
- HTTP, ``_client`` (the SDK's ``requests`` session wrapper) and its ``_transport``, ``_endpoint``,
  ``_headers``, ``_compress``: one POST of our bytes, no SDK retry loop, so the response (413 to split
  on, partial success) and the time left are ours. Checked by ``_http_transport``.
- gRPC, ``_stub`` (the factory the SDK calls on every reconnect) and ``_client``: replaced by a stub
  whose request serializer is the identity and which keeps the response, read for partial success
  (the SDK's stub drops it). Checked by ``_grpc_stub_ready``; ``_initialize_channel_and_stub`` is only
  called to reconnect at once after UNAVAILABLE, and a failure keeps the old channel.
When a later exporter release moves any of them, ``sends_bytes`` is False and every span goes through
the SDK's own ``export`` (its encoder, its retries), counted delivered or kept for the outbox by that
result; only the outbox's re-sends of stored requests need the byte path and wait for it (RETRY).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_agenttape.capture.delivery import (
    DEFAULT_MAX_REQUEST_BYTES,
    Outcome,
    Sent,
    deliver,
    encode_bounded,
)
from otel_agenttape.codec.otlp_encode import encode_trace_request

try:
    from grpc import RpcError, StatusCode
except ImportError:  # pragma: no cover - grpcio is a dependency
    RpcError = StatusCode = None  # type: ignore[assignment,misc]

_logger = logging.getLogger(__name__)
_WARN_EVERY_S = 60.0


class _PartialSuccess:
    """Spans a receiver accepted the request of but rejected (OTLP partial success). The SDK exporters
    report such a request as exported; these count the rejected spans (``tape.stats()`` shows them as
    ``spans_rejected``) and log the receiver's reason, at most once a minute."""

    def __init__(self) -> None:
        self.rejected = 0
        self._warned_at = -_WARN_EVERY_S

    def note(self, response: Any) -> int:
        if response is None or not response.HasField("partial_success"):
            return 0
        n = response.partial_success.rejected_spans
        if n <= 0:
            return 0
        self.rejected += n
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            _logger.warning("the OTLP receiver rejected %d span(s) of a request (%d so far): %s", n,
                            self.rejected, response.partial_success.error_message or "no reason given")
        return n

    def note_body(self, body: bytes | None) -> int:
        if not body:
            return 0
        try:
            return self.note(ExportTraceServiceResponse.FromString(body))
        except Exception:  # noqa: BLE001 - not an OTLP response (a proxy's page, JSON): nothing to count
            return 0

    def counts(self) -> dict[str, int]:
        return {"spans_rejected": self.rejected}


def _encode(spans: Sequence[ReadableSpan]) -> bytes:
    try:
        return encode_trace_request(spans)
    except Exception:  # noqa: BLE001 - the SDK encoder, which raises on what cannot be encoded at all
        return encode_spans(spans).SerializePartialToString()


def _http_outcome(status: int) -> Outcome:
    if 200 <= status < 300:
        return Outcome.OK
    if status == 413:
        return Outcome.TOO_LARGE
    if status in (408, 429) or status >= 500:
        return Outcome.RETRY
    if status in (401, 403, 404):
        return Outcome.KEEP
    return Outcome.REFUSED


def _http_transport(exporter: Any) -> bool:
    """Whether the HTTP exporter's private client can send our bytes (see the module doc)."""
    client = getattr(exporter, "_client", None)
    return all(hasattr(client, a) for a in ("_transport", "_endpoint", "_headers", "_compress")) and callable(
        getattr(getattr(client, "_transport", None), "request", None))


def _grpc_stub_ready(exporter: Any) -> bool:
    """Whether the gRPC exporter has the stub factory, client, channel and call state to replace."""
    return (hasattr(exporter, "_stub") and getattr(exporter, "_client", None) is not None
            and all(hasattr(exporter, a) for a in ("_channel", "_headers", "_shutdown")))


class _Delivering:
    """What both exporters add: byte-bounded requests, one account of every span, a prompt stop.

    ``sends_bytes`` False (the SDK internals moved): ``deliver_spans`` is the SDK exporter's ``export``."""

    max_request_bytes: int
    sends_bytes: bool = False
    _stop: threading.Event

    def _init_delivery(self, max_request_bytes: int | None) -> None:
        self.partial_success = _PartialSuccess()
        self.max_request_bytes = DEFAULT_MAX_REQUEST_BYTES if max_request_bytes is None else int(max_request_bytes)
        self._stop = threading.Event()

    def send_once(self, data: bytes, timeout: float) -> tuple[Outcome, int, str]:
        raise NotImplementedError

    def _timeout_s(self) -> float:
        raise NotImplementedError

    def _sdk_export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise NotImplementedError

    def deliver_requests(self, requests: list[tuple[bytes, int]], *, retry: bool = True,
                         timeout: float | None = None) -> Sent:
        """Send serialized requests in order (split on 413); see ``delivery.deliver``."""
        return deliver(requests, self.send_once, timeout=self._timeout_s() if timeout is None else timeout,
                       retry=retry, stop=self._stop)

    def deliver_spans(self, spans: Sequence[ReadableSpan], *, retry: bool = True) -> Sent:
        """Encode into requests of at most ``max_request_bytes`` and deliver them."""
        if not self.sends_bytes:
            if self._sdk_export(spans) is SpanExportResult.SUCCESS:
                return Sent(delivered=len(spans))
            requests, too_large = encode_bounded(spans, self.max_request_bytes, _encode)
            return Sent(too_large=too_large, undelivered=requests)  # for the outbox, when there is one
        metrics = getattr(self, "_metrics", None)
        requests, too_large = encode_bounded(spans, self.max_request_bytes, _encode)
        if metrics is None:
            sent = self.deliver_requests(requests, retry=retry)
        else:
            with metrics.export_operation(len(spans)) as result:
                sent = self.deliver_requests(requests, retry=retry)
                if sent.undelivered or sent.refused:
                    result.error = RuntimeError(f"{sent.kept + sent.refused} span(s) not delivered")
        sent.too_large += too_large
        return sent

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._stop.is_set():
            return SpanExportResult.FAILURE
        sent = self.deliver_spans(spans)
        ok = not sent.undelivered and not sent.refused and not sent.too_large
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE


class TapeOtlpHttpSpanExporter(_Delivering, OTLPSpanExporter):
    """``OTLPSpanExporter`` (HTTP/protobuf) whose requests are encoded by ``encode_trace_request``,
    bounded in bytes and sent through the SDK's HTTP transport."""

    def __init__(self, *args: Any, max_request_bytes: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_delivery(max_request_bytes)
        sdk_limit = getattr(self, "_max_request_size", 0) or 0
        if sdk_limit > 0 and (self.max_request_bytes <= 0 or sdk_limit < self.max_request_bytes):
            self.max_request_bytes = sdk_limit  # the SDK's own max_request_size, when smaller
        self.sends_bytes = _http_transport(self)

    def _timeout_s(self) -> float:
        return float(getattr(getattr(self, "_client", None), "_timeout", None) or getattr(self, "_timeout", 10.0))

    def _sdk_export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return OTLPSpanExporter.export(self, spans)

    def send_once(self, data: bytes, timeout: float) -> tuple[Outcome, int, str]:
        """One POST, no retry: what the receiver said of it."""
        if not self.sends_bytes:
            return Outcome.RETRY, 0, "the installed exporter has no transport to send through"
        client = self._client
        result = client._transport.request("POST", client._endpoint, headers=client._headers,
                                           data=client._compress(data), timeout=max(0.01, timeout))
        status = result.status_code
        if status is None:
            return Outcome.RETRY, 0, str(result.error or "no response")
        outcome = _http_outcome(status)
        rejected = 0
        if outcome is Outcome.OK:
            try:
                rejected = self.partial_success.note_body(result.content())
            except Exception:  # noqa: BLE001 - no body to read
                pass
        return outcome, rejected, f"HTTP {status} {result.reason or ''}".strip()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.sends_bytes:
            return OTLPSpanExporter.export(self, spans)
        return _Delivering.export(self, spans)

    def shutdown(self) -> None:
        self._stop.set()
        if not getattr(self, "_shutdown", False):
            OTLPSpanExporter.shutdown(self)


_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _SerializedTraceStub:
    """A TraceService client whose requests are already serialized bytes; it reads the response's
    partial success (the SDK's exporter drops the response)."""

    def __init__(self, channel: Any, partial: _PartialSuccess) -> None:
        self._export = channel.unary_unary(
            _EXPORT_METHOD, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
        )
        self._partial = partial
        self.last_rejected = 0

    def Export(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the gRPC stub's method name
        response = self._export(*args, **kwargs)
        try:
            self.last_rejected = self._partial.note(response)
        except Exception:  # noqa: BLE001 - counting never fails an export
            pass
        return response

    def send(self, data: bytes, metadata: Any, timeout: float) -> int:
        """One call; the spans the receiver rejected (partial success). Raises ``RpcError``."""
        response = self._export(data, metadata=metadata, timeout=timeout)
        return self._partial.note(response)


_GRPC_RETRY = ("CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "OUT_OF_RANGE", "UNAVAILABLE",
               "DATA_LOSS")


def _grpc_outcome(code: Any, details: str) -> Outcome:
    name = getattr(code, "name", str(code))
    if name == "RESOURCE_EXHAUSTED" and "larger than" in (details or "").lower():
        return Outcome.TOO_LARGE  # grpc's "Received message larger than max"
    if name in _GRPC_RETRY:
        return Outcome.RETRY
    if name in ("UNAUTHENTICATED", "PERMISSION_DENIED", "UNIMPLEMENTED"):
        return Outcome.KEEP
    return Outcome.REFUSED


class TapeOtlpGrpcSpanExporter(_Delivering, GrpcSpanExporter):
    """``OTLPSpanExporter`` (gRPC) whose requests are encoded by ``encode_trace_request``, bounded in
    bytes and sent over the SDK exporter's channel."""

    def __init__(self, *args: Any, max_request_bytes: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_delivery(max_request_bytes)
        self._channel_lock = threading.Lock()
        if _grpc_stub_ready(self):
            # the base class rebuilds the client from ``_stub`` when it reconnects
            partial = self.partial_success
            self._stub = lambda channel: _SerializedTraceStub(channel, partial)
            self._client = _SerializedTraceStub(self._channel, partial)
            self.sends_bytes = True

    def _timeout_s(self) -> float:
        return float(getattr(self, "_timeout", 10.0))

    def _sdk_export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return GrpcSpanExporter.export(self, spans)

    def _translate_data(self, data: Sequence[ReadableSpan]) -> Any:
        if not self.sends_bytes:
            return super()._translate_data(data)
        try:
            return encode_trace_request(data)
        except Exception:  # noqa: BLE001 - the SDK encoder decides what to do with it
            return encode_spans(data).SerializeToString()

    def send_once(self, data: bytes, timeout: float) -> tuple[Outcome, int, str]:
        client = self._client
        if not self.sends_bytes or client is None or self._shutdown:
            return Outcome.RETRY, 0, "exporter shut down" if self.sends_bytes else "no stub to send bytes through"
        try:
            return Outcome.OK, client.send(data, self._headers, max(0.01, timeout)), "OK"
        except RpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if getattr(code, "name", "") == "UNAVAILABLE":
                self._reconnect()
            return _grpc_outcome(code, details), 0, f"gRPC {getattr(code, 'name', code)}: {details}"

    def _reconnect(self) -> None:
        """A new channel, so a receiver that is back is reached now, not after gRPC's reconnect backoff
        (the SDK's private ``_initialize_channel_and_stub``; should it fail or be gone, the old channel
        stays and gRPC reconnects it in its own time)."""
        with self._channel_lock:
            if self._shutdown:
                return
            old = self._channel
            try:
                self._initialize_channel_and_stub()
            except Exception:  # noqa: BLE001 - keep the old channel
                return
            try:
                old.close()
            except Exception:  # noqa: BLE001
                pass

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.sends_bytes:
            return GrpcSpanExporter.export(self, spans)
        return _Delivering.export(self, spans)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._stop.set()
        if not getattr(self, "_shutdown", False):
            GrpcSpanExporter.shutdown(self, timeout_millis=timeout_millis, **kwargs)
