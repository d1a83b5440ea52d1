"""Log records (GenAI events, Python logging bridged by the SDK) delivered like spans: bounded requests,
retries within the exporter's timeout, and what the receiver does not take kept in the outbox.

``TapeLogExporter`` wraps the SDK's OTLP log exporter (HTTP or gRPC), keeping its endpoint, header,
TLS and compression resolution from the ``OTEL_EXPORTER_OTLP_*`` variables, and sends the encoded
requests itself through ``delivery.deliver``. A batch it cannot deliver goes to ``OUTBOX/logs`` (lanes
of their own, records of kind ``KIND_LOGS``), re-sent oldest first by this process or the next one
started with the same outbox, or loaded by ``agenttape ingest OUTBOX``. Every record is counted:
delivered, kept in the outbox, or lost (refused, too large, outbox full, no outbox).

Sealing is not done here: the tape's log processor (``log_sealing``), ahead of this exporter's batch
processor, seals each record written in a live span into that span.
"""

from __future__ import annotations

import collections
import logging
import threading
from pathlib import Path
from typing import Any, Sequence

from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult

from otel_agenttape import outboxfile
from otel_agenttape.capture.delivery import DEFAULT_MAX_REQUEST_BYTES, Outcome, Sent, deliver, encode_bounded
from otel_agenttape.capture.otlp_exporters import _grpc_outcome, _http_outcome, _http_transport

_log = logging.getLogger(__name__)
COUNTERS = ("logs_exported", "logs_to_outbox", "logs_outbox_delivered", "logs_outbox_pending", "logs_refused",
            "logs_dropped_too_large", "logs_dropped_outbox_full", "logs_export_failed")
LOST = ("logs_refused", "logs_dropped_too_large", "logs_dropped_outbox_full", "logs_export_failed")


def _encode(batch: Sequence[Any]) -> bytes:
    return encode_logs(batch).SerializeToString()


def _no_split(data: bytes) -> list[tuple[bytes, int]]:
    return []  # a log request the receiver finds too large is dropped and counted (requests are bounded)


class TapeLogExporter(LogRecordExporter):
    """The SDK's OTLP log exporter with our delivery and the outbox (see the module doc)."""

    def __init__(self, inner: Any, *, outbox: str | Path | None = None, max_request_bytes: int | None = None,
                 outbox_options: dict[str, Any] | None = None) -> None:
        self._inner = inner
        self._grpc = type(inner).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")
        self._bytes = self._grpc or _http_transport(inner)  # False: the SDK's HTTP internals moved
        self.max_request_bytes = int(max_request_bytes or DEFAULT_MAX_REQUEST_BYTES)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._counts = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self.outbox = None
        if outbox:
            from otel_agenttape.capture.outbox import Outbox

            opts = {k: v for k, v in (outbox_options or {}).items() if k in ("max_bytes", "fsync", "segment_bytes")}
            self.outbox = Outbox(Path(outbox) / outboxfile.LOGS_FOLDER, deliver=self._resend, kind=outboxfile.KIND_LOGS,
                                 max_request_bytes=self.max_request_bytes, **opts)
            self.outbox.start()

    # ---- one attempt --------------------------------------------------------------------------
    def _timeout_s(self) -> float:
        client = getattr(self._inner, "_client", None)
        return float(getattr(client, "_timeout", None) or getattr(self._inner, "_timeout", None) or 10.0)

    def send_once(self, data: bytes, timeout: float) -> tuple[Outcome, int, str]:
        """One request, no retry: what the receiver said of it."""
        if self._grpc:
            return self._send_grpc(data, timeout)
        if not self._bytes:
            return Outcome.RETRY, 0, "the installed exporter has no transport to send through"
        client = self._inner._client
        result = client._transport.request("POST", client._endpoint, headers=client._headers,
                                           data=client._compress(data), timeout=max(0.01, timeout))
        if result.status_code is None:
            return Outcome.RETRY, 0, str(result.error or "no response")
        return _http_outcome(result.status_code), 0, f"HTTP {result.status_code}"

    def _send_grpc(self, data: bytes, timeout: float) -> tuple[Outcome, int, str]:
        from grpc import RpcError
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

        client = getattr(self._inner, "_client", None)
        if client is None or getattr(self._inner, "_shutdown", False):
            return Outcome.RETRY, 0, "exporter shut down"
        try:
            client.Export(ExportLogsServiceRequest.FromString(data), metadata=self._inner._headers,
                          timeout=max(0.01, timeout))
            return Outcome.OK, 0, "OK"
        except RpcError as exc:
            return _grpc_outcome(exc.code(), exc.details() or ""), 0, f"gRPC {exc.code()}"

    def _resend(self, requests: list[tuple[bytes, int]]) -> Sent:
        sent = deliver(requests, self.send_once, timeout=self._timeout_s(), retry=False, split=_no_split)
        with self._lock:
            self._counts["logs_outbox_delivered"] += sent.delivered
        return sent

    # ---- the exporter -------------------------------------------------------------------------
    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        try:
            return self._export(batch)
        except Exception:  # noqa: BLE001 - never raise into the app's logging
            _log.debug("log export failed", exc_info=True)
            with self._lock:
                self._counts["logs_export_failed"] += len(batch)
            return LogRecordExportResult.FAILURE

    def _export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        requests, too_large = encode_bounded(list(batch), self.max_request_bytes, _encode)
        if self._stop.is_set() or (self.outbox is not None and self.outbox.backlog()):
            sent = Sent(undelivered=requests)  # shutting down, or the receiver is down: straight to the outbox
        elif not self._bytes:  # the SDK exporter's own export (its encoder and retries)
            ok = self._inner.export(batch) is LogRecordExportResult.SUCCESS
            sent = Sent(delivered=len(batch)) if ok else Sent(undelivered=requests)
        else:
            sent = deliver(requests, self.send_once, timeout=self._timeout_s(), retry=True, stop=self._stop,
                           split=_no_split)
        kept = 0
        if sent.undelivered and self.outbox is not None:
            kept = self.outbox.write_requests(sent.undelivered)
        with self._lock:
            c = self._counts
            c["logs_exported"] += sent.delivered
            c["logs_to_outbox"] += kept
            c["logs_refused"] += sent.refused
            c["logs_dropped_too_large"] += too_large + sent.too_large
            if self.outbox is not None:
                c["logs_dropped_outbox_full"] += sent.kept - kept
            else:
                c["logs_export_failed"] += sent.kept
        ok = not sent.undelivered and not sent.refused and not sent.too_large and not too_large
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def stats(self) -> dict[str, int]:
        """The counters (``COUNTERS``), with the records the outbox still holds."""
        with self._lock:
            out = dict(self._counts)
        if self.outbox is not None:
            out["logs_outbox_pending"] = self.outbox.counts()["outbox_spans_pending"]
        return out

    def stop_sending(self) -> None:
        """At exit, out of time: the export in progress and every later one go to the outbox."""
        self._stop.set()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        self._stop.set()
        if self.outbox is not None:
            self.outbox.close()
        try:
            self._inner.shutdown()
        except Exception:  # noqa: BLE001
            pass
