"""The leaf is the same bytes from the live span, OTLP protobuf, OTLP JSON, DuckDB and Parquet.

Random spans with adversarial attribute values (huge ints, -0.0, NaN/Inf, bytes, nested arrays and
maps, astral and private-use keys, unpaired surrogates) go through the sealing processor, the OTLP
encoder, the receiver's decoders, the store and a Parquet lake.
"""

from __future__ import annotations

import math
import random
import struct
import tempfile

import rfc8785
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from integrity_support import encode, otlp_json, proto_spans, sealed_provider
from opentelemetry import trace as trace_api
from opentelemetry.trace import (
    Link,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from otel_agenttape import semconv
from otel_agenttape.codec.otlp_decode import JSON, PROTOBUF, decode_traces
from otel_agenttape.integrity import leaf_from_proto, leaf_from_sdk, link_hash
from otel_agenttape.integrity.jcs import dumps as jcs_dumps
from otel_agenttape.integrity.leaf import project_sdk
from otel_agenttape.store.parquet import export_parquet
from otel_agenttape.store.reader import open_reader
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.sealed_rows import load_rows, row_leaf
from otel_agenttape.tape.verification import verify_store

KEY_POOL = ["a", "Z", "_", ".", "\ue000", "\uffee", "\U0001f600", "\U00010000", "\u00e9", "\u05d3", "\ud800", "\udfff"]
CHAR_RANGES = [(0x20, 0x7F), (0, 0x20), (0x80, 0x800), (0x800, 0xD800), (0xD800, 0xE000), (0xE000, 0x10000),
               (0x10000, 0x110000)]
INT_EDGES = [0, -1, 2**31, 2**53, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**70, -(2**90)]
FLOAT_EDGES = [0.0, -0.0, math.nan, math.inf, -math.inf, 1.0, 1e-7, 1e21, 5e-324, 1.7976931348623157e308, 0.1]
KINDS = list(trace_api.SpanKind)
STATUSES = [None, (StatusCode.OK, None), (StatusCode.ERROR, "boom \u00e9"), (StatusCode.ERROR, None)]


def r_text(rng, n: int) -> str:
    lo, hi = rng.choice(CHAR_RANGES)
    return "".join(chr(rng.randrange(lo, hi)) for _ in range(rng.randrange(n + 1)))


def r_key(rng) -> str:
    return "".join(rng.choice(KEY_POOL) if rng.random() < 0.6 else r_text(rng, 1) or "k" for _ in range(rng.randrange(1, 5)))


def r_scalar(rng):
    pick = rng.randrange(8)
    if pick == 0:
        return r_text(rng, 16)
    if pick == 1:
        return rng.randrange(-(2**70), 2**70)
    if pick == 2:
        return rng.choice(INT_EDGES)
    if pick == 3:
        return rng.choice(FLOAT_EDGES)
    if pick == 4:
        return rng.uniform(-1e6, 1e6) * 10 ** rng.randrange(-30, 30)
    if pick == 5:
        return rng.random() < 0.5
    if pick == 6:
        return rng.randbytes(rng.randrange(12))
    return struct.unpack("<d", rng.randbytes(8))[0]  # any bit pattern: subnormals, NaN payloads


def r_value(rng, depth: int = 0):
    pick = rng.random()
    if depth < 3 and pick < 0.12:
        return [r_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if depth < 3 and pick < 0.22:
        return {r_key(rng): r_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return r_scalar(rng)


def r_attrs(rng, n: int = 8) -> dict:
    return {r_key(rng): r_value(rng) for _ in range(rng.randrange(n + 1))}


def r_plan(rng) -> dict:
    return {
        "name": r_text(rng, 10),
        "kind": rng.choice(KINDS),
        "attrs": r_attrs(rng),
        "events": [(r_text(rng, 6), r_attrs(rng, 3)) for _ in range(rng.randrange(3))],
        "links": [r_attrs(rng, 2) for _ in range(rng.randrange(2))],
        "status": rng.choice(STATUSES),
        "node": rng.choice([None, "model", "tool"]),
    }


REMOTE = SpanContext(0x1F2E3D4C5B6A79881726354453627180, 0x0102030405060708, True,
                     TraceFlags(TraceFlags.SAMPLED), TraceState([("vendor", "v1"), ("x", "y")]))


def _record(plans, remote_parent: bool):
    provider, sealer, exporter = sealed_provider(checkpoint_every=16)
    tracer = provider.get_tracer("otel_agenttape")
    ctx = trace_api.set_span_in_context(trace_api.NonRecordingSpan(REMOTE)) if remote_parent else None
    with tracer.start_as_current_span("invoke_agent t", context=ctx, attributes={semconv.RUN_ID: "run-x"}):
        for p in plans:
            links = [Link(REMOTE, a) for a in p["links"]]
            attrs = dict(p["attrs"])
            if p["node"]:
                attrs[semconv.NODE_TYPE] = p["node"]
            span = tracer.start_span(p["name"], kind=p["kind"], attributes=attrs, links=links)
            for name, ev in p["events"]:
                span.add_event(name, ev)
            if p["status"]:
                span.set_status(Status(*p["status"]))
            span.end()
    provider.shutdown()
    assert sealer.errors == 0
    return exporter.get_finished_spans()


def _leaves_from_rows(reader):
    return {r["span_id"]: row_leaf(r) for r in load_rows(reader, "TRUE")}


def check_round_trip(spans) -> int:
    sdk = {f"{s.context.span_id:016x}": leaf_from_sdk(s) for s in spans}
    for s in spans:  # the exported copy carries a link over exactly this leaf
        a = s.attributes
        if semconv.CHAIN_HASH in a:
            assert link_hash(a[semconv.CHAIN_PREV], sdk[f"{s.context.span_id:016x}"]) == a[semconv.CHAIN_HASH]
            assert jcs_dumps(project_sdk(s)) == rfc8785.dumps(project_sdk(s)) == sdk[f"{s.context.span_id:016x}"]
    req = encode(spans)
    assert {s.span_id.hex(): leaf_from_proto(s) for s in proto_spans(req)} == sdk
    via_pb = decode_traces(req.SerializeToString(), PROTOBUF)
    assert {s.span_id.hex(): leaf_from_proto(s) for s in proto_spans(via_pb)} == sdk
    via_json = decode_traces(otlp_json(req), JSON)
    assert {s.span_id.hex(): leaf_from_proto(s) for s in proto_spans(via_json)} == sdk
    store = Store(None)
    try:
        store.write_traces([via_json])
        reader = store.reader()
        assert _leaves_from_rows(reader) == sdk
        reports = verify_store(reader)
        assert reports and all(r.valid for r in reports), [r.reason for r in reports]
        with tempfile.TemporaryDirectory() as lake:
            export_parquet(reader, lake)
            lake_reader = open_reader(lake)
            try:
                assert _leaves_from_rows(lake_reader) == sdk
            finally:
                lake_reader.close()
    finally:
        store.close()
    return len(spans)


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
@given(st.integers(0, 2**64), st.integers(20, 90), st.booleans())
def test_random_spans_round_trip_to_identical_leaves(seed, n, remote_parent) -> None:
    rng = random.Random(seed)  # hypothesis picks the seed; values come from the adversarial pools above
    plans = [r_plan(rng) for _ in range(n)]
    spans = _record(plans, remote_parent)
    assert len(spans) >= len(plans) + 1
    check_round_trip(spans)


def test_adversarial_values_are_made_otlp_safe_and_recorded() -> None:
    provider, _sealer, exporter = sealed_provider()
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: "r"}) as span:
        span.set_attribute("huge", 2**64)
        span.set_attribute("lone", "a\ud800b")
        span.set_attribute("pair", "\ud83d\ude00")
        span.set_attribute("nested", {"k": [2**80, "x\udfff"]})
        span.set_attribute("fine", 2**63 - 1)
        span.add_event("e", {"big": -(2**64)})
    provider.shutdown()
    s = exporter.get_finished_spans()[0]
    a = s.attributes
    assert a["huge"] == str(2**64) and a["lone"] == "a\ufffdb" and a["pair"] == "\U0001f600"
    assert a["nested"] == {"k": (str(2**80), "x\ufffd")} and a["fine"] == 2**63 - 1
    assert set(a[semconv.INTEGRITY_COERCED]) == {"huge", "lone", "pair", "nested", "event:0:big"}
    assert s.events[0].attributes["big"] == str(-(2**64))
    check_round_trip(exporter.get_finished_spans())


def test_type_distinctions_change_the_leaf() -> None:
    def leaf_of(value):
        provider, _, exporter = sealed_provider()
        tracer = provider.get_tracer("x")
        with tracer.start_as_current_span("s", start_time=1, end_on_exit=False) as sp:
            sp.set_attribute("v", value)
            sp.end(end_time=2)
        return project_sdk(exporter.get_finished_spans()[0])["attributes"]["v"]

    assert leaf_of(1) == {"i": "1"} and leaf_of(1.0) == {"d": "1.0"} and leaf_of(True) == {"bool": True}
    assert leaf_of(-0.0) == {"d": "-0.0"} and leaf_of(0.0) == {"d": "0.0"}
    assert leaf_of(math.nan) == {"d": "NaN"} and leaf_of(-math.inf) == {"d": "-Infinity"}
    assert leaf_of(b"\x00\xff") == {"b": "AP8="} and leaf_of("AP8=") == {"s": "AP8="}
    assert leaf_of("e\u0301") != leaf_of("\u00e9")  # no Unicode normalization
    assert leaf_of(2**53 + 1) == {"i": str(2**53 + 1)}
