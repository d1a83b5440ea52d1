"""End to end through the official OTLP/HTTP and OTLP/gRPC exporters to servers on 127.0.0.1,
decoded with opentelemetry-proto; plus the 5,000-span burst."""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

import otel_agenttape
from otel_agenttape import semconv as sc


class _Collected:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.headers: list[dict] = []

    def add(self, body: bytes, headers: dict):
        req = trace_service_pb2.ExportTraceServiceRequest()
        req.ParseFromString(body)
        with self.lock:
            self.requests.append(req)
            self.headers.append(headers)

    def spans(self):
        with self.lock:
            out = []
            for req in self.requests:
                for rs in req.resource_spans:
                    service = {kv.key: kv.value.string_value for kv in rs.resource.attributes}.get("service.name")
                    for ss in rs.scope_spans:
                        out.extend((service, s) for s in ss.spans)
            return out


@pytest.fixture
def http_collector():
    collected = _Collected()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.path == "/v1/traces"
            collected.add(body, {k.lower(): v for k, v in self.headers.items()})
            payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", collected
    server.shutdown()
    server.server_close()


@pytest.fixture
def grpc_collector():
    collected = _Collected()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            collected.add(request.SerializeToString(), dict(context.invocation_metadata()))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", collected
    server.stop(None)


def _attrs(span):
    out = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
        else:
            out[kv.key] = getattr(v, kind)
    return out


BIG = ("0123456789abcdef" * 65536)[:-3] + "é"  # ~1 MB, ends in a multi-byte char


def _agent(tape):
    with tape.run(agent="planner", session_id="S") as run:
        with run.model_call(model="gpt-4o", provider="openai",
                            messages=[{"role": "user", "content": "fetch the file"}]) as call:
            call.delta("calling")
            call.finish(usage={"prompt_tokens": 10, "completion_tokens": 3},
                        tool_calls=[{"id": "c1", "type": "function",
                                     "function": {"name": "read_file", "arguments": "{\"p\": \"/x\"}"}}])
        with run.tool_call("read_file", {"p": "/x"}, call_id="c1") as tool:
            tool.result(BIG)
        with run.child(agent="reviewer") as child:
            with child.model_call(model="claude", messages="review") as call:
                call.delta("ok")
    return run, child


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_export_through_real_otlp_exporters(protocol, http_collector, grpc_collector, monkeypatch):
    monkeypatch.setitem(sys.modules, "otel_agenttape.capture.sealing", None)
    endpoint, collected = http_collector if protocol == "http/protobuf" else grpc_collector
    tape = otel_agenttape.setup(endpoint=endpoint, protocol=protocol, service_name="svc-e2e",
                                headers={"x-tape-token": "t0k"})
    run, child = _agent(tape)
    assert tape.force_flush()
    tape.shutdown()
    stats = tape.stats()
    assert stats["spans_exported"] == 5 and stats["spans_export_failed"] == 0
    spans = collected.spans()
    assert {svc for svc, _ in spans} == {"svc-e2e"}
    assert collected.headers[0].get("x-tape-token") == "t0k"
    by_name = {s.name: s for _, s in spans}
    assert set(by_name) == {"invoke_agent planner", "chat gpt-4o", "execute_tool read_file",
                            "invoke_agent reviewer", "chat claude"}
    root = by_name["invoke_agent planner"]
    assert root.parent_span_id == b""
    for name, parent in (("chat gpt-4o", root), ("execute_tool read_file", root),
                         ("invoke_agent reviewer", root), ("chat claude", by_name["invoke_agent reviewer"])):
        assert by_name[name].parent_span_id == parent.span_id, name
        assert by_name[name].trace_id == root.trace_id
    kinds = {n: s.kind for n, s in by_name.items()}
    assert kinds["chat gpt-4o"] == PbSpan.SPAN_KIND_CLIENT
    assert kinds["execute_tool read_file"] == PbSpan.SPAN_KIND_INTERNAL
    assert kinds["invoke_agent planner"] == PbSpan.SPAN_KIND_INTERNAL
    ra, ca, ta = _attrs(root), _attrs(by_name["chat gpt-4o"]), _attrs(by_name["execute_tool read_file"])
    assert ra[sc.GEN_AI_OPERATION_NAME] == "invoke_agent" and ra[sc.RUN_ID] == run.run_id
    assert ra[sc.RUN_STATUS] == "completed" and ra[sc.NODE_TYPE] == "run"
    assert ca[sc.GEN_AI_OPERATION_NAME] == "chat" and ca[sc.GEN_AI_PROVIDER_NAME] == "openai"
    assert ca[sc.GEN_AI_USAGE_INPUT_TOKENS] == 10 and ca[sc.STEP] == 1 and ca[sc.NODE_TYPE] == "model"
    assert json.loads(ca[sc.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "fetch the file"}]}]
    assert ca[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_call"]
    events = by_name["chat gpt-4o"].events
    assert [e.name for e in events] == [sc.EVENT_TEXT]
    assert ta[sc.GEN_AI_TOOL_NAME] == "read_file" and ta[sc.GEN_AI_TOOL_CALL_ID] == "c1"
    assert ta[sc.GEN_AI_TOOL_CALL_RESULT].encode("utf-8") == BIG.encode("utf-8")  # byte-exact 1 MB
    assert len(ta[sc.GEN_AI_TOOL_CALL_RESULT].encode()) > 1_000_000
    assert _attrs(by_name["invoke_agent reviewer"])[sc.PARENT_RUN_ID] == run.run_id


def test_burst_of_5000_spans_no_drops(http_collector):
    # The default pipeline, sealing included when the sealing module is present.
    endpoint, collected = http_collector
    tape = otel_agenttape.setup(endpoint=endpoint)
    payload = [{"role": "user", "content": "x" * 2000}]
    with tape.run(agent="burst") as run:
        for i in range(4999):
            with run.tool_call("t", payload, call_id=str(i)) as tool:
                tool.result("y" * 500)
    assert tape.force_flush(120000)
    tape.shutdown()
    stats = tape.stats()
    assert stats["spans_dropped_queue_full"] == 0 and stats["spans_export_failed"] == 0
    agent_spans = [s for _, s in collected.spans() if s.name != sc.EVENT_CHECKPOINT]
    assert len(agent_spans) == 5000
    assert stats["spans_exported"] == len(collected.spans())


def test_full_queue_blocks_until_the_exporter_makes_room(monkeypatch):
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    monkeypatch.setitem(sys.modules, "otel_agenttape.capture.sealing", None)
    received = []

    class Slow(SpanExporter):
        def export(self, spans):
            time.sleep(0.002)
            received.extend(spans)
            return SpanExportResult.SUCCESS

    tape = otel_agenttape.setup(exporter=Slow(), queue_options={"max_queue_size": 64, "max_export_batch_size": 16})
    with tape.run(agent="b") as run:
        for i in range(2999):
            with run.tool_call("t", None, call_id=str(i)):
                pass
    tape.force_flush()
    tape.shutdown()
    stats = tape.stats()
    assert stats["enqueue_blocked"] > 0
    assert stats["spans_dropped_queue_full"] == 0 and len(received) == 3000 == stats["spans_exported"]


def test_setup_honours_otlp_environment(grpc_collector, monkeypatch):
    monkeypatch.setitem(sys.modules, "otel_agenttape.capture.sealing", None)
    endpoint, collected = grpc_collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-from-env=yes")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "env-svc")
    tape = otel_agenttape.setup()
    with tape.run(agent="env"):
        pass
    tape.shutdown()
    [(service, span)] = collected.spans()
    assert service == "env-svc" and span.name == "invoke_agent env"
    assert collected.headers[0]["x-from-env"] == "yes"


def test_dead_backend_drops_instead_of_stalling(monkeypatch):
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    monkeypatch.setitem(sys.modules, "otel_agenttape.capture.sealing", None)

    class Dead(SpanExporter):
        def export(self, spans):
            time.sleep(0.05)
            return SpanExportResult.FAILURE

    tape = otel_agenttape.setup(exporter=Dead(), queue_options={"max_queue_size": 20, "max_export_batch_size": 10})
    start = time.monotonic()
    with tape.run(agent="d") as run:
        for i in range(300):
            with run.tool_call("t", None, call_id=str(i)):
                pass
    elapsed = time.monotonic() - start
    tape.shutdown()
    stats = tape.stats()
    assert elapsed < 3
    assert stats["spans_dropped_queue_full"] > 0 and stats["export_failures"] > 0
    # shutdown does not retry a failing exporter: what is still queued is counted as left behind
    assert stats["spans_dropped_shutdown"] > 0 and stats["queue_length"] == 0
    assert (stats["spans_dropped_queue_full"] + stats["spans_export_failed"] + stats["spans_exported"]
            + stats["spans_dropped_shutdown"]) == 301


def test_forked_child_keeps_exporting(http_collector, monkeypatch):
    import os

    monkeypatch.setitem(sys.modules, "otel_agenttape.capture.sealing", None)
    endpoint, collected = http_collector
    tape = otel_agenttape.setup(endpoint=endpoint)
    with tape.run(agent="parent"):
        pass
    tape.force_flush()
    pid = os.fork()
    if pid == 0:  # child: a run of its own must still leave the process
        code = 1
        try:
            with tape.run(agent="forked"):
                pass
            code = 0 if tape.force_flush(10000) and tape.stats()["spans_exported"] >= 2 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    tape.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0
    assert {s.name for _, s in collected.spans()} == {"invoke_agent parent", "invoke_agent forked"}
