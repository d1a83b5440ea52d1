"""Our OTLP request encoder against the SDK's: same bytes for the same spans, and the exporter that
uses it delivers through the official HTTP transport."""

from __future__ import annotations

import logging
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from otel_agenttape.capture.otlp_exporters import TapeOtlpHttpSpanExporter
from otel_agenttape.codec import otlp_encode
from otel_agenttape.codec.otlp_encode import encode_trace_request

RESOURCE = Resource({"service.name": "planner", "host.id": "h-1"})
SCOPE = InstrumentationScope("otel_agenttape", "0.1.0", None, {"scope.attr": 1})


def ctx(trace_id: int = 0x0AF7651916CD43DD8448EB211C80319C, span_id: int = 0x00F067AA0BA902B7,
        remote: bool = False, state: TraceState | None = None) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=TraceFlags(1), trace_state=state)


def span(attributes=None, *, name="chat gpt-4o", span_id=0x00F067AA0BA902B7, parent=None, events=(), links=(),
         kind=SpanKind.CLIENT, status=None, resource=RESOURCE, scope=SCOPE, state=None) -> ReadableSpan:
    return ReadableSpan(name=name, context=ctx(span_id=span_id, state=state), parent=parent,
                        resource=resource, attributes=attributes, events=events, links=links, kind=kind,
                        status=status or Status(StatusCode.UNSET), start_time=1_700_000_000_000_000_001,
                        end_time=1_700_000_000_123_456_789, instrumentation_scope=scope)


def assert_same(spans) -> None:
    ours = encode_trace_request(spans)
    sdk = encode_spans(spans).SerializeToString()
    assert ExportTraceServiceRequest.FromString(ours) == ExportTraceServiceRequest.FromString(sdk)
    assert ours == sdk
    compiled = otlp_encode.native_module
    if compiled is not None:  # the compiled twin writes each span as the reference does
        for s in spans:
            assert compiled.encode_span(s) == otlp_encode.encode_span(s)


def test_a_capture_model_span_encodes_like_the_sdk():
    long_text = "Lisbon in May: Alfama, Belém, Sintra. " * 80
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.request.temperature": 0.2,
             "gen_ai.usage.input_tokens": 412, "gen_ai.usage.output_tokens": 0, "agenttape.model.retry_count": -1,
             "gen_ai.response.finish_reasons": ("stop",), "gen_ai.output.messages": long_text,
             "agenttape.truncated": False, "gen_ai.input.messages": "ü" * 300}
    events = [Event("gen_ai.content.delta", {"text": "Day 1"}, timestamp=1_700_000_000_000_000_500),
              Event("agenttape.model.retry", {"reason": "429"}, timestamp=1_700_000_000_000_000_900)]
    parent = ctx(span_id=0x1111111111111111)
    assert_same([span(attrs, parent=parent, events=events)])
    # Repeated spans hit the encoding cache and must still agree.
    assert_same([span(attrs, span_id=i + 1, parent=parent, events=events) for i in range(50)])


def test_links_status_trace_state_and_remote_parents():
    state = TraceState([("vendor", "a1"), ("other", "b=2")])
    links = [Link(ctx(span_id=0x22, remote=True), {"agenttape.link": "parent_run"}),
             Link(ctx(span_id=0x33), None)]
    remote_parent = ctx(span_id=0x44, remote=True)
    assert_same([span({"k": "v"}, parent=remote_parent, links=links, state=state,
                      status=Status(StatusCode.ERROR, "tool failed: timeout"), kind=SpanKind.INTERNAL)])
    assert_same([span(None, status=Status(StatusCode.OK), kind=SpanKind.SERVER, name="")])


def test_grouping_by_resource_and_scope_keeps_first_seen_order():
    other_resource = Resource({"service.name": "researcher"})
    equal_resource = Resource({"service.name": "planner", "host.id": "h-1"})  # equal, another object
    other_scope = InstrumentationScope("openinference.instrumentation.openai", "1.0", "https://schema/1.26")
    spans = [span({"i": 0}, span_id=1), span({"i": 1}, span_id=2, resource=other_resource),
             span({"i": 2}, span_id=3, scope=other_scope), span({"i": 3}, span_id=4, resource=equal_resource),
             span({"i": 4}, span_id=5, scope=None)]
    assert_same(spans)
    decoded = ExportTraceServiceRequest.FromString(encode_trace_request(spans))
    assert [len(rs.scope_spans) for rs in decoded.resource_spans] == [3, 1]


def test_values_that_compare_equal_keep_their_own_types():
    # True == 1 == 1.0 and 0.0 == -0.0 in Python: a cache keyed on values alone would mix them up.
    for value in (True, 1, 1.0, "1", 0.0, -0.0, False, 0, math.inf, -math.inf):
        assert_same([span({"x": value}, span_id=i + 1) for i in range(3)])
    decoded = ExportTraceServiceRequest.FromString(encode_trace_request([span({"x": -0.0})]))
    assert math.copysign(1, decoded.resource_spans[0].scope_spans[0].spans[0].attributes[0].value.double_value) == -1


def test_a_key_with_ever_changing_values_stops_growing_the_cache():
    spans = [span({"agenttape.chain.hash": f"{i:064x}"}, span_id=i + 1) for i in range(200)]
    assert_same(spans)
    for s in spans:  # the reference encoder keeps the cache (the compiled twin needs none)
        otlp_encode.encode_span(s)
    assert len(otlp_encode._str_cache["agenttape.chain.hash"]) <= otlp_encode._CACHE_PER_KEY


def test_unencodable_attributes_are_skipped_like_the_sdk_does(caplog):
    attrs = {"ok": "yes", "surrogate": "bad \ud800 text", "huge": 1 << 70, "after": 2}
    with caplog.at_level(logging.ERROR):
        assert_same([span(attrs)])
    decoded = ExportTraceServiceRequest.FromString(encode_trace_request([span(attrs)]))
    assert [kv.key for kv in decoded.resource_spans[0].scope_spans[0].spans[0].attributes] == ["ok", "after"]


def test_the_compiled_twin_hands_odd_values_to_the_reference_and_logs_what_it_logs(caplog):
    """Values the compiled encoder leaves to the reference (text UTF-8 cannot hold, an int beyond int64,
    a set, a str or int subclass, a non-ASCII key, a mapping with a non-text key, deep nesting) come
    out as the reference and the SDK write them, with the same log lines; and the requests use the
    compiled encoder wherever it is built."""
    import enum

    from otel_agenttape import native

    class Color(enum.IntEnum):
        RED = 3

    class Name(str):
        pass

    attrs = {"ok": "yes", "surrogate": "bad \ud800 text", "huge": -(1 << 64), "a set": [{1, 2}],
             "enum": Color.RED, "sub": Name("x"), "clé": "v", "ключ": ["ü", 2.5], "": "no key",
             "int keys": {1: "a"}, "deep": [[["x", {"k": [None, b"\x01"]}]]], "neg": -1, "after": 2}
    compiled = otlp_encode.native_module
    if native.DISABLED or compiled is None:
        assert otlp_encode._encode_span is otlp_encode.encode_span
        assert_same([span(attrs)])
        return
    assert otlp_encode._encode_span is compiled.encode_span
    with caplog.at_level(logging.ERROR):
        reference = otlp_encode.encode_span(span(attrs))
    logged = [r.getMessage() for r in caplog.records]
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert compiled.encode_span(span(attrs)) == reference
    assert [r.getMessage() for r in caplog.records] == logged and len(logged) == 3
    assert_same([span(attrs), span(attrs, span_id=2, events=[Event("e", attrs, timestamp=9)])])


def test_nested_values_bytes_and_none():
    attrs = {"seq": ("a", "b"), "ints": [1, -2, 1 << 62], "bools": (True, False), "blob": b"\x00\xff",
             "map": {"a": 1, "b": {"c": [1.5, None]}}, "none": None, "empty": ()}
    assert_same([span(attrs)])


scalar = st.one_of(st.text(max_size=300), st.integers(-(1 << 63), (1 << 63) - 1), st.booleans(),
                   st.floats(allow_nan=False), st.binary(max_size=40))
values = st.one_of(scalar, st.lists(st.text(max_size=20), max_size=4).map(tuple),
                   st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=4).map(tuple),
                   st.recursive(scalar, lambda inner: st.lists(inner, max_size=3).map(tuple)
                                | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(st.text(max_size=12), values, max_size=8), min_size=1, max_size=4))
def test_random_attributes_encode_like_the_sdk(attribute_sets):
    assert_same([span(attrs, span_id=i + 1,
                      events=[Event("e", attrs, timestamp=5)] if i % 2 else ())
                 for i, attrs in enumerate(attribute_sets)])


class _Collector(BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self):  # noqa: N802 - http.server API
        type(self).bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def collector():
    _Collector.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    server.shutdown()
    server.server_close()


def test_the_exporter_posts_our_encoding_through_the_official_transport(collector):
    exporter = TapeOtlpHttpSpanExporter(endpoint=collector)
    spans = [span({"gen_ai.operation.name": "chat", "n": i}, span_id=i + 1) for i in range(3)]
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert _Collector.bodies == [encode_spans(spans).SerializeToString()]
    exporter.shutdown()
    assert exporter.export(spans) is SpanExportResult.FAILURE  # the SDK's shutdown rule still holds


def test_a_request_over_the_size_limit_is_refused_not_sent(collector, caplog, monkeypatch):
    from otel_agenttape.capture import delivery

    monkeypatch.setattr(delivery, "_warned_at", [float("-inf")])  # the warning comes at most once a minute
    exporter = TapeOtlpHttpSpanExporter(endpoint=collector, max_request_size=100)
    with caplog.at_level(logging.WARNING):
        assert exporter.export([span({"text": "x" * 500})]) is SpanExportResult.FAILURE
    assert _Collector.bodies == []
    assert "exceeds the request size limit of 100 bytes" in caplog.text
    exporter.shutdown()


def test_an_encoding_failure_falls_back_to_the_sdk_encoder(collector, monkeypatch):
    def broken(spans):
        raise RuntimeError("boom")

    monkeypatch.setattr("otel_agenttape.capture.otlp_exporters.encode_trace_request", broken)
    exporter = TapeOtlpHttpSpanExporter(endpoint=collector)
    spans = [span({"a": "b"})]
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert _Collector.bodies == [encode_spans(spans).SerializeToString()]
    exporter.shutdown()


def test_without_the_sdk_internals_every_span_goes_through_the_sdk_export(collector, monkeypatch):
    # A later exporter release without the private client parts we send through: the checks say so at
    # construction and the queue's deliver_spans is the SDK's own export, not a send that never succeeds.
    from opentelemetry.exporter.otlp.proto.http import trace_exporter

    assert TapeOtlpHttpSpanExporter(endpoint=collector).sends_bytes
    real_init = trace_exporter.OTLPSpanExporter.__init__

    def init_without_transport(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self._client = type("Client", (), {"_timeout": 1.0})()  # no _transport, _endpoint, ...

    monkeypatch.setattr(trace_exporter.OTLPSpanExporter, "__init__", init_without_transport)
    exporter = TapeOtlpHttpSpanExporter(endpoint=collector)
    assert not exporter.sends_bytes
    used: list[int] = []
    monkeypatch.setattr(trace_exporter.OTLPSpanExporter, "export",
                        lambda self, spans: used.append(len(spans)) or SpanExportResult.SUCCESS)
    spans = [span({"n": i}, span_id=i + 1) for i in range(3)]
    sent = exporter.deliver_spans(spans)
    assert (sent.delivered, sent.undelivered, used) == (3, [], [3])
    monkeypatch.setattr(trace_exporter.OTLPSpanExporter, "export", lambda self, spans: SpanExportResult.FAILURE)
    sent = exporter.deliver_spans(spans)
    assert sent.delivered == 0 and sent.kept == 3 and sent.undelivered[0][0]  # encoded, for the outbox
    assert exporter.send_once(b"x", 1.0)[0].name == "RETRY"


def test_setup_uses_it_for_http(collector):
    import otel_agenttape

    tape = otel_agenttape.setup(endpoint=collector, seal=False)
    try:
        with tape.run(agent="wire") as run:
            with run.tool_call("search", {"q": "lisbon"}, call_id="c1") as tool:
                tool.result({"hits": 3})
        assert tape.force_flush()
    finally:
        tape.shutdown()
    names = [s.name for b in _Collector.bodies for rs in ExportTraceServiceRequest.FromString(b).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    assert sorted(names) == ["execute_tool search", "invoke_agent wire"]


def test_the_grpc_exporter_sends_our_encoding_and_survives_a_reconnect():
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    from otel_agenttape.capture.otlp_exporters import TapeOtlpGrpcSpanExporter

    received: list[bytes] = []

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        calls = 0

        def Export(self, request, context):  # noqa: N802 - gRPC API
            Service.calls += 1
            if Service.calls == 1:  # the exporter must reconnect (rebuilding its client) and retry
                context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
            received.append(request.SerializeToString())
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        exporter = TapeOtlpGrpcSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
        spans = [span({"gen_ai.operation.name": "execute_tool", "n": i}, span_id=i + 1) for i in range(3)]
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        assert Service.calls == 2
        assert received == [encode_spans(spans).SerializeToString()]
        exporter.shutdown()
    finally:
        server.stop(None)


def test_a_whole_sealed_multi_agent_tape_encodes_like_the_sdk():
    """Everything the default pipeline exports for the demo's agents (sealed copies, streamed-text,
    reasoning and retry events, a failing tool, child runs, checkpoint spans) gives identical bytes."""
    import otel_agenttape
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_agenttape.demo import run_demo_agents

    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, service_name="wire-demo")
    try:
        run_demo_agents(tape)
        with tape.run(agent="planner") as first:
            carrier = tape.inject()
        with tape.run(agent="remote-child", parent=carrier):  # another process's child: a span link
            pass
        assert tape.force_flush()
    finally:
        tape.shutdown()
    spans = exporter.get_finished_spans()
    assert any("agenttape.chain.hash" in s.attributes for s in spans)
    assert any(s.events for s in spans) and any(s.links for s in spans)
    assert_same(list(spans))
    assert first.run_id
    for i in range(0, len(spans), 7):  # and in the smaller batches an export queue hands over
        assert_same(list(spans[i:i + 7]))


def test_spans_over_the_sdk_limits_keep_their_dropped_counts_sealed_or_not():
    """Real SDK spans past their attribute, event and link limits: the dropped counts (read from the
    SDK's bounded holders, or through a sealed copy's properties) are written as the SDK writes them."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_agenttape.capture.sealed_span import SealedSpan
    from otel_agenttape.capture.sealing import SealingSpanProcessor

    limits = SpanLimits(max_span_attributes=3, max_events=2, max_links=1, max_event_attributes=1)
    raw, sealed = InMemorySpanExporter(), InMemorySpanExporter()
    spans = []
    for exporter, wrap in ((raw, False), (sealed, True)):
        provider = TracerProvider(span_limits=limits)
        downstream = SimpleSpanProcessor(exporter)
        provider.add_span_processor(SealingSpanProcessor(downstream) if wrap else downstream)
        tracer = provider.get_tracer("otel_agenttape")
        links = [Link(ctx(span_id=0x55 + i)) for i in range(3)]
        with tracer.start_as_current_span("invoke_agent planner", attributes={"agenttape.run.id": "r1"}):
            with tracer.start_as_current_span("chat gpt-4o", links=links) as s:
                s.set_attributes({f"k{i}": i for i in range(6)})
                for i in range(4):
                    s.add_event(f"e{i}", {"a": i, "b": "x", "c": 1.5})
        provider.shutdown()
        spans.extend(exporter.get_finished_spans())
    chats = [s for s in spans if s.name == "chat gpt-4o"]
    assert [type(s) for s in chats] == [ReadableSpan, SealedSpan]
    for s in chats:
        assert (s.dropped_attributes, s.dropped_events, s.dropped_links) == (3, 2, 2)
        assert all(e.dropped_attributes == 2 for e in s.events)
    if otlp_encode.native_module is not None:
        assert otlp_encode.native_module.reads_fields(ReadableSpan)
        assert otlp_encode.native_module.reads_fields(SealedSpan)
    assert_same(spans)


def test_a_span_type_that_overrides_a_property_is_read_through_it():
    """A span type of another library that computes a field in a property gets that value on the wire."""

    class Renamed(ReadableSpan):
        @property
        def name(self) -> str:
            return "renamed " + self._name

    renamed = Renamed(name="chat", context=ctx(), resource=RESOURCE, attributes={"k": "v"},
                      start_time=1, end_time=2, instrumentation_scope=SCOPE)
    assert_same([renamed])
    decoded = ExportTraceServiceRequest.FromString(encode_trace_request([renamed]))
    assert decoded.resource_spans[0].scope_spans[0].spans[0].name == "renamed chat"
    if otlp_encode.native_module is not None:
        assert not otlp_encode.native_module.reads_fields(Renamed)
