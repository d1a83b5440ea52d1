"""The official OTLP span exporters (HTTP and gRPC), with requests encoded by ``otlp_wire``.

Everything but the encoding is the SDK exporters' own: endpoint and header resolution, the
``OTEL_EXPORTER_OTLP_*`` variables, compression, TLS, retries with backoff (and gRPC reconnects),
the request size limit and their self-metrics. The wire bytes are the same the SDK encoder produces (tests compare them);
they cost about a third of the CPU. Should a later exporter release move the internals this relies
on, or should encoding ever fail, the export falls back to the SDK's own path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_agenttape.capture.otlp_wire import encode_trace_request

try:  # internals of opentelemetry-exporter-otlp-proto-http >= 1.45
    from opentelemetry.exporter.otlp.proto.http._common import (
        RequestPayloadTooLargeError,
        _is_request_too_large,
    )
    from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE
except ImportError:  # pragma: no cover - depends on the installed exporter
    _is_request_too_large = None  # type: ignore[assignment]

_logger = logging.getLogger(__name__)
_WARN_EVERY_S = 60.0


class _PartialSuccess:
    """Spans a receiver accepted the request of but rejected (OTLP partial success). The SDK exporters
    report such a request as exported; these count the rejected spans (``tape.stats()`` shows them as
    ``spans_rejected``) and log the receiver's reason, at most once a minute."""

    def __init__(self) -> None:
        self.rejected = 0
        self._warned_at = -_WARN_EVERY_S

    def note(self, response: Any) -> None:
        if response is None or not response.HasField("partial_success"):
            return
        n = response.partial_success.rejected_spans
        if n <= 0:
            return
        self.rejected += n
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            _logger.warning("the OTLP receiver rejected %d span(s) of a request (%d so far): %s", n,
                            self.rejected, response.partial_success.error_message or "no reason given")

    def note_body(self, body: bytes | None) -> None:
        if not body:
            return
        try:
            self.note(ExportTraceServiceResponse.FromString(body))
        except Exception:  # noqa: BLE001 - not an OTLP response (a proxy's page, JSON): nothing to count
            pass

    def counts(self) -> dict[str, int]:
        return {"spans_rejected": self.rejected}


class _LastResult:
    """The HTTP transport of the SDK's client, keeping the last result so its body can be read."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.last: Any = None

    def request(self, *args: Any, **kwargs: Any) -> Any:
        self.last = None
        self.last = result = self._inner.request(*args, **kwargs)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TapeOtlpHttpSpanExporter(OTLPSpanExporter):
    """``OTLPSpanExporter`` (HTTP/protobuf) whose request encoding is ``encode_trace_request``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.partial_success = _PartialSuccess()
        client = getattr(self, "_client", None)
        self._last = None
        if client is not None and hasattr(client, "_transport"):
            self._last = client._transport = _LastResult(client._transport)

    def _note_response(self) -> None:
        last = self._last.last if self._last is not None else None
        if last is None:
            return
        try:
            body = last.content()
        except Exception:  # noqa: BLE001 - no body to read
            return
        self.partial_success.note_body(body)

    def _fast_path_ready(self) -> bool:
        return (_is_request_too_large is not None and not getattr(self, "_shutdown", True)
                and hasattr(self, "_client") and hasattr(self, "_metrics")
                and hasattr(self, "_max_request_size"))

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self._export(spans)
        if result is SpanExportResult.SUCCESS:
            self._note_response()
        return result

    def _export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self._fast_path_ready():
            return super().export(spans)
        try:
            data = encode_trace_request(spans)
        except Exception:  # noqa: BLE001 - the SDK path encodes (and reports) it its own way
            return super().export(spans)
        with self._metrics.export_operation(len(spans)) as result:
            if _is_request_too_large(data, self._max_request_size):
                _logger.warning("Dropping span batch: serialized size %d bytes exceeds max_request_size %d bytes.",
                                len(data), self._max_request_size)
                result.error = RequestPayloadTooLargeError(
                    f"Serialized span request size {len(data)} bytes exceeds max_request_size "
                    f"{self._max_request_size} bytes."
                )
                return SpanExportResult.FAILURE
            export_result = self._client.export(data)
            if not export_result.success:
                result.error = export_result.error
                status = getattr(export_result, "status_code", None)
                result.error_attrs = {HTTP_RESPONSE_STATUS_CODE: status} if status is not None else None
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _SerializedTraceStub:
    """A TraceService client whose requests are already serialized bytes; it reads the response's
    partial success (the SDK's exporter drops the response)."""

    def __init__(self, channel: Any, partial: _PartialSuccess) -> None:
        self._export = channel.unary_unary(
            _EXPORT_METHOD, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
        )
        self._partial = partial

    def Export(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - the gRPC stub's method name
        response = self._export(*args, **kwargs)
        try:
            self._partial.note(response)
        except Exception:  # noqa: BLE001 - counting never fails an export
            pass
        return response


class TapeOtlpGrpcSpanExporter(GrpcSpanExporter):
    """``OTLPSpanExporter`` (gRPC) whose request encoding is ``encode_trace_request``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.partial_success = _PartialSuccess()
        self._serialized = False
        if hasattr(self, "_stub") and getattr(self, "_client", None) is not None and hasattr(self, "_channel"):
            # the base class rebuilds the client from ``_stub`` when it reconnects
            partial = self.partial_success
            self._stub = lambda channel: _SerializedTraceStub(channel, partial)
            self._client = _SerializedTraceStub(self._channel, partial)
            self._serialized = True

    def _translate_data(self, data: Sequence[ReadableSpan]) -> Any:
        if not self._serialized:
            return super()._translate_data(data)
        try:
            return encode_trace_request(data)
        except Exception:  # noqa: BLE001 - the SDK encoder decides what to do with it
            return encode_spans(data).SerializeToString()
