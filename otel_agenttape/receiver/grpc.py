"""OTLP/gRPC receiver: ``TraceService/Export`` and ``LogsService/Export``.

Handlers take the raw request bytes (no deserializer) so a valid protobuf request goes into the WAL
as received, without a second serialization. Errors follow the OTLP spec: INVALID_ARGUMENT for bad
data, UNAUTHENTICATED without the bearer token, RESOURCE_EXHAUSTED / UNAVAILABLE with RetryInfo
(in ``grpc-status-details-bin`` and ``google.rpc.retryinfo-bin``) when ingest is behind.
"""

from __future__ import annotations

import hmac
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from otel_agenttape.codec.otlp_decode import LOGS, PROTOBUF, TRACES, DecodeError, TooManyItems
from otel_agenttape.receiver.metrics import Metrics
from otel_agenttape.receiver.pipeline import Backpressure
from otel_agenttape.receiver.service import ExportService, retry_info, rpc_status
from otel_agenttape.receiver.wal import WalClosed

log = logging.getLogger(__name__)

_TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


class GrpcReceiver:
    """A grpc server exposing the OTLP trace and logs services."""

    def __init__(
        self,
        host: str,
        port: int,
        service: ExportService,
        metrics: Metrics,
        token: str | None,
        max_body: int,
        workers: int = 16,
        idle_timeout: float = 60.0,
    ) -> None:
        self.service = service
        self.metrics = metrics
        self.token = token
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agenttape-grpc"),
            options=[
                ("grpc.max_receive_message_length", max_body),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
                ("grpc.so_reuseport", 0),
                # an idle connection is sent GOAWAY (clients reconnect when they next export)
                ("grpc.max_connection_idle_ms", int(idle_timeout * 1000)),
            ],
            maximum_concurrent_rpcs=workers * 4,
        )
        handlers = {
            _TRACE_SERVICE: {"Export": self._handler(TRACES)},
            _LOGS_SERVICE: {"Export": self._handler(LOGS)},
        }
        for name, methods in handlers.items():
            self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, methods),))
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise OSError(f"cannot bind gRPC to {host}:{port}")

    def _handler(self, signal: str) -> grpc.RpcMethodHandler:
        def export(request: bytes, context: grpc.ServicerContext) -> bytes:
            return self._export(signal, request, context)

        return grpc.unary_unary_rpc_method_handler(export)

    def _authorized(self, context: grpc.ServicerContext) -> bool:
        if not self.token:
            return True
        for key, value in context.invocation_metadata():
            if key == "authorization":
                scheme, _, got = str(value).partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(got.strip().encode(), self.token.encode())
        return False

    def _abort(self, context: grpc.ServicerContext, code: grpc.StatusCode, message: str,
               retry_after: float | None = None, bad_request: bool = False) -> None:
        st = rpc_status(code.value[0], message, retry_after, bad_request)
        md: list[tuple[str, Any]] = [("grpc-status-details-bin", st.SerializeToString())]
        if retry_after is not None:
            md.append(("google.rpc.retryinfo-bin", retry_info(retry_after).SerializeToString()))
        context.set_trailing_metadata(tuple(md))
        context.abort(code, message)

    def _export(self, signal: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        start = time.perf_counter()
        code = "OK"
        try:
            if not self._authorized(context):
                code = "UNAUTHENTICATED"
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            try:
                resp = self.service.export(signal, request, PROTOBUF)
            except (DecodeError, TooManyItems) as exc:  # a request that can never succeed: not retried
                code = "INVALID_ARGUMENT"
                self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), bad_request=True)
            except Backpressure as exc:
                sc = grpc.StatusCode.UNAVAILABLE if exc.unavailable else grpc.StatusCode.RESOURCE_EXHAUSTED
                code = sc.name
                self._abort(context, sc, str(exc), retry_after=exc.retry_after)
            except (WalClosed, OSError) as exc:
                code = "UNAVAILABLE"
                log.error("cannot make a request durable: %s", exc)
                self._abort(context, grpc.StatusCode.UNAVAILABLE, f"cannot store the request now: {exc}", 5.0)
            self.metrics.observe("agenttape_ingest_latency_seconds", time.perf_counter() - start)
            return resp.SerializeToString()
        finally:
            self.metrics.inc("agenttape_requests_total", transport="grpc", signal=signal, code=code)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float = 2.0) -> None:
        self._server.stop(grace).wait(grace + 1)
