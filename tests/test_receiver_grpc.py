"""OTLP/gRPC receiver on 127.0.0.1: the official exporter, raw calls, errors, auth, size limit."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from receiver_util import grpc_call, logs_request, span_keys, stored_keys, trace_request

from otel_agenttape.receiver.server import TapeServer


@pytest.fixture
def server(tmp_path):
    srv = TapeServer(str(tmp_path / "tape.duckdb"), http_port=0, grpc_port=0).start()
    yield srv
    srv.stop()


def test_official_grpc_exporters(server):
    provider = TracerProvider(resource=Resource.create({"service.name": "grpc-test"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True))
    )
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("outer"):
        with tracer.start_as_current_span("inner"):
            pass
    provider.shutdown()

    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

    lp = LoggerProvider()
    lp.add_log_record_processor(
        SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True))
    )
    import logging

    from opentelemetry.sdk._logs import LoggingHandler

    logger = logging.getLogger("grpc-receiver-test")
    logger.addHandler(LoggingHandler(logger_provider=lp))
    logger.error("over grpc")
    lp.shutdown()
    assert server.wait_idle(10)
    t = server.query("SELECT name, service_name FROM spans ORDER BY name")
    assert t.column("name").to_pylist() == ["inner", "outer"]
    assert set(t.column("service_name").to_pylist()) == {"grpc-test"}
    assert server.query("SELECT count(*) FROM log_records").column(0)[0].as_py() == 1


def test_raw_export_duplicates_gzip_and_partial_success(server):
    req = trace_request(3)
    for compression in (None, grpc.Compression.Gzip, None):
        code, resp, _ = grpc_call(server.grpc_port, req.SerializeToString(), compression=compression)
        assert code == grpc.StatusCode.OK
        assert ExportTraceServiceResponse.FromString(resp) == ExportTraceServiceResponse()
    bad = trace_request(2)
    bad.resource_spans[0].scope_spans[0].spans[1].span_id = b"\x00" * 8
    code, resp, _ = grpc_call(server.grpc_port, bad.SerializeToString())
    assert code == grpc.StatusCode.OK
    assert ExportTraceServiceResponse.FromString(resp).partial_success.rejected_spans == 1
    code, resp, _ = grpc_call(server.grpc_port, logs_request(2).SerializeToString(), service="logs")
    assert code == grpc.StatusCode.OK and ExportLogsServiceResponse.FromString(resp) == ExportLogsServiceResponse()
    good = bad.resource_spans[0].scope_spans[0].spans[0]
    assert stored_keys(server) == span_keys(req) | {(good.trace_id.hex(), good.span_id.hex())}


def test_invalid_argument_with_bad_request_details(server):
    code, _, md = grpc_call(server.grpc_port, b"\x0a\xff\xff\xff\xff\x0f junk")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    st = status_pb2.Status.FromString(md["grpc-status-details-bin"])
    assert any(d.Is(error_details_pb2.BadRequest.DESCRIPTOR) for d in st.details)
    all_bad = trace_request(1)
    all_bad.resource_spans[0].scope_spans[0].spans[0].trace_id = b"\x01" * 3
    code, _, _ = grpc_call(server.grpc_port, all_bad.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_grpc_size_limit(tmp_path):
    srv = TapeServer(str(tmp_path / "s.duckdb"), http_port=0, grpc_port=0, max_body=32 * 1024).start()
    try:
        big = trace_request(300, attrs={"pad": "y" * 200}).SerializeToString()
        assert len(big) > 32 * 1024
        code, _, _ = grpc_call(srv.grpc_port, big)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        code, _, _ = grpc_call(srv.grpc_port, big, compression=grpc.Compression.Gzip)  # limit after inflating
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        code, _, _ = grpc_call(srv.grpc_port, trace_request(1).SerializeToString())
        assert code == grpc.StatusCode.OK
    finally:
        srv.stop()


def test_grpc_token(tmp_path):
    srv = TapeServer(str(tmp_path / "a.duckdb"), http_port=0, grpc_port=0, token="tok").start()
    try:
        body = trace_request(1).SerializeToString()
        assert grpc_call(srv.grpc_port, body)[0] == grpc.StatusCode.UNAUTHENTICATED
        assert grpc_call(srv.grpc_port, body, metadata=[("authorization", "Bearer nope")])[0] == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        assert grpc_call(srv.grpc_port, body, metadata=[("authorization", "Bearer tok")])[0] == grpc.StatusCode.OK
        exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{srv.grpc_port}", insecure=True,
                                    headers={"authorization": "Bearer tok"})
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer("t").start_span("authorized").end()
        provider.shutdown()
        assert srv.wait_idle(10)
        assert srv.query("SELECT count(*) FROM spans").column(0)[0].as_py() == 2
    finally:
        srv.stop()
