"""The transport-independent part of an OTLP export: prepare (decode, validate, convert), make durable, answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_agenttape.codec.otlp_decode import TRACES, DecodeError, TooManyItems
from otel_agenttape.receiver.limits import DEFAULT_MAX_SPANS_PER_REQUEST
from otel_agenttape.receiver.metrics import Metrics
from otel_agenttape.receiver.pipeline import Backpressure, IngestPipeline
from otel_agenttape.receiver.wal import KIND_LOGS, KIND_TRACES


class ExportService:
    """Shared by the HTTP and gRPC transports so both apply the same rules."""

    def __init__(self, pipeline: IngestPipeline, metrics: Metrics,
                 is_ready: Callable[[], bool] = lambda: True,
                 max_items: int = DEFAULT_MAX_SPANS_PER_REQUEST) -> None:
        self.pipeline = pipeline
        self.metrics = metrics
        self.is_ready = is_ready
        self.max_items = max_items  # spans (log records) per request: more is refused before decoding

    def export(self, signal: str, body: bytes, media: str) -> Any:
        """Handle one decompressed request body; returns the Export*ServiceResponse.

        Raises ``DecodeError`` (400) when nothing in the request can be stored, ``TooManyItems``
        (413) past ``max_items`` spans or log records, and ``Backpressure`` (429/503) when the queue
        is full or the receiver is not ready yet.
        """
        if not self.is_ready():
            raise Backpressure("the receiver is starting (replaying its write-ahead log)", 2.0, unavailable=True)
        if signal == TRACES:
            kind, unit = KIND_TRACES, "spans"
            resp: Any = ExportTraceServiceResponse()
        else:
            kind, unit = KIND_LOGS, "logs"
            resp = ExportLogsServiceResponse()
        try:
            v = self.pipeline.prepare(kind, body, media, self.max_items)
        except TooManyItems:
            self.metrics.inc("agenttape_requests_too_many_items_total", signal=signal)
            raise
        if v.rejected:
            for reason, n in (v.reasons or {"invalid_id": v.rejected}).items():
                self.metrics.inc(f"agenttape_{unit}_rejected_total", n, reason=reason)
            if not v.accepted:
                raise DecodeError(f"no valid {'spans' if kind == KIND_TRACES else 'log records'}: {v.message}")
        if v.accepted:
            self.pipeline.accept(kind, v.request, v.wal_record(body), v.accepted, v.tables)
            self.metrics.inc(f"agenttape_{unit}_accepted_total", v.accepted)
        if v.rejected:
            if kind == KIND_TRACES:
                resp.partial_success.rejected_spans = v.rejected
            else:
                resp.partial_success.rejected_log_records = v.rejected
            resp.partial_success.error_message = v.message
        return resp


def rpc_status(code: int, message: str, retry_after: float | None = None, bad_request: bool = False) -> status_pb2.Status:
    """A google.rpc.Status with RetryInfo (throttling) or BadRequest (invalid data) details."""
    st = status_pb2.Status(code=code, message=message)
    if retry_after is not None:
        st.details.add().Pack(retry_info(retry_after))
    if bad_request:
        br = error_details_pb2.BadRequest()
        br.field_violations.add(field="request", description=message)
        st.details.add().Pack(br)
    return st


def retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    whole = int(seconds)
    return error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=whole, nanos=int((seconds - whole) * 1e9))
    )
