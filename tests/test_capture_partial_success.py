"""A receiver that answers OTLP partial success: the rejected spans show in tape.stats() and the log.

The SDK's exporters treat such an answer as a full success. Two loopback servers (HTTP and gRPC)
answer every trace export with ``rejected_spans`` set, as a receiver does for spans it cannot keep.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

import otel_agenttape


def _answer(body: bytes) -> bytes:
    req = ExportTraceServiceRequest.FromString(body)
    n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
    # every other span rejected, with a reason
    return ExportTraceServiceResponse(partial_success=ExportTracePartialSuccess(
        rejected_spans=n // 2, error_message="span kind out of range")).SerializeToString()


@pytest.fixture
def http_endpoint():
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            out = _answer(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1/traces", "http/protobuf"
    srv.shutdown()


@pytest.fixture
def grpc_endpoint():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler("opentelemetry.proto.collector.trace.v1.TraceService", {
        "Export": grpc.unary_unary_rpc_method_handler(lambda body, ctx: _answer(body),
                                                      request_deserializer=None, response_serializer=None),
    })
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", "grpc"
    server.stop(0)


@pytest.mark.parametrize("backend", ["http_endpoint", "grpc_endpoint"])
def test_spans_a_receiver_rejects_are_counted_and_logged(backend, request, caplog):
    endpoint, protocol = request.getfixturevalue(backend)
    tape = otel_agenttape.setup(endpoint=endpoint, protocol=protocol, service_name="partial", insecure=True)
    try:
        with caplog.at_level(logging.WARNING, logger="otel_agenttape.capture.otlp_exporters"):
            for i in range(3):
                with tape.run(agent="a", input=f"q{i}") as run:
                    with run.tool_call("t", {"i": i}) as tool:
                        tool.result(i)
            assert tape.force_flush(10_000)
        stats = tape.stats()
        exported = stats["spans_exported"]
        assert exported >= 6
        # each request had half its spans (rounded down) rejected: between a quarter and a half in all
        assert exported // 4 <= stats["spans_rejected"] <= exported // 2 and stats["spans_rejected"] > 0
        assert any("rejected" in r.getMessage() and "span kind out of range" in r.getMessage() for r in caplog.records)
    finally:
        tape.shutdown()
