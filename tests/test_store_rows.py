"""OTLP -> Arrow rows: ids, times, typed attributes and promoted columns, built from real SDK spans."""

from __future__ import annotations

import datetime as dt

import orjson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from otel_agenttape.codec import typed as anyvalue
from otel_agenttape import semconv as sc
from otel_agenttape.store import rows, samples, tables, wirecache

T0 = 1_767_225_600_123_456_789  # 2026-01-01T00:00:00.123456789Z
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)


def _typed_spans():
    def build(tracer):
        with tracer.start_as_current_span(
            "invoke_agent a", start_time=T0, attributes={sc.GEN_AI_OPERATION_NAME: "invoke_agent", sc.RUN_ID: "r1"},
            end_on_exit=False,
        ) as root:
            child = tracer.start_span(
                "chat m",
                kind=SpanKind.CLIENT,
                start_time=T0 + 1,
                links=[Link(root.get_span_context(), {"why": "x"})],
                attributes={
                    "i.max": I64_MAX,
                    "i.min": I64_MIN,
                    "d.one": 1.0,
                    "d.neg0": -0.0,
                    "b": b"\x00\xffab",
                    "flag": True,
                    "ints": [1, 2, 3],
                    "text": "héllo \"q\" \n",
                    sc.GEN_AI_OPERATION_NAME: "chat",
                    sc.GEN_AI_SYSTEM: "openai",
                    sc.GEN_AI_USAGE_INPUT_TOKENS: 12,
                    sc.GEN_AI_USAGE_OUTPUT_TOKENS: 3,
                    sc.STEP: 4,
                    sc.CHAIN_SEQ: 9,
                    sc.CHAIN_HASH: "ab" * 32,
                },
            )
            child.add_event("e0", {"n": 1}, timestamp=T0 + 2)
            child.add_event("e1", {"n": 1.5}, timestamp=T0 + 3)
            child.set_status(Status(StatusCode.ERROR, "boom"))
            child.end(end_time=T0 + 1_000_000_007)
            root.end(end_time=T0 + 2_000_000_000)

    return samples.sdk_requests(build)


def test_spans_columns_types_and_ids():
    reqs = _typed_spans()
    t = rows.traces_to_tables(reqs)
    assert t.spans.schema == rows.SCHEMAS["spans"]
    by_name = {r["name"]: r for r in t.spans.to_pylist()}
    root, child = by_name["invoke_agent a"], by_name["chat m"]
    proto_child = [s for s in reqs[0].resource_spans[0].scope_spans[0].spans if s.name == "chat m"][0]
    assert child["trace_id"] == proto_child.trace_id.hex() and child["trace_id"] == child["trace_id"].lower()
    assert len(child["trace_id"]) == 32 and len(child["span_id"]) == 16
    assert child["parent_span_id"] == root["span_id"] and root["parent_span_id"] is None
    assert child["start_time_unix_nano"] == T0 + 1 and child["end_time_unix_nano"] == T0 + 1_000_000_007
    assert child["date"] == dt.date(2026, 1, 1)
    assert child["kind"] == 3 and child["status_code"] == 2 and child["status_message"] == "boom"
    attrs = orjson.loads(child["attributes"])
    assert attrs["i.max"] == {"i": str(I64_MAX)} and attrs["i.min"] == {"i": str(I64_MIN)}
    assert attrs["d.one"] == {"d": "1.0"} and attrs["d.neg0"] == {"d": "-0.0"}
    assert anyvalue.to_python(attrs["b"]) == b"\x00\xffab"
    assert attrs["flag"] == {"bool": True}
    assert attrs["ints"] == {"a": [{"i": "1"}, {"i": "2"}, {"i": "3"}]}
    # byte-identical to the shared encoding used by the integrity leaf
    assert child["attributes"] == anyvalue.dumps(anyvalue.attrs_from_proto(proto_child.attributes))
    # promoted columns
    assert child["provider_name"] == "openai" and child["operation_name"] == "chat"
    assert child["input_tokens"] == 12 and child["output_tokens"] == 3 and child["step"] == 4
    assert child["chain_seq"] == 9 and child["chain_hash"] == "ab" * 32
    assert root["run_id"] == "r1" and child["run_id"] is None
    assert child["service_name"] == "test-service" and child["scope_name"] == "otel_agenttape.tests"


def test_events_links_resources():
    t = rows.traces_to_tables(_typed_spans())
    ev = t.span_events.to_pylist()
    assert [e["event_index"] for e in ev] == [0, 1] and [e["name"] for e in ev] == ["e0", "e1"]
    assert [e["time_unix_nano"] for e in ev] == [T0 + 2, T0 + 3]
    assert orjson.loads(ev[0]["attributes"]) == {"n": {"i": "1"}}
    assert orjson.loads(ev[1]["attributes"]) == {"n": {"d": "1.5"}}
    links = t.span_links.to_pylist()
    assert len(links) == 1 and links[0]["link_index"] == 0
    root = [r for r in t.spans.to_pylist() if r["parent_span_id"] is None][0]
    assert links[0]["linked_span_id"] == root["span_id"]
    res = t.resources.to_pylist()
    assert len(res) == 1 and len(res[0]["resource_id"]) == 64
    assert orjson.loads(res[0]["attributes"])["service.name"] == {"s": "test-service"}
    assert {r["resource_id"] for r in t.spans.to_pylist()} == {res[0]["resource_id"]}


def test_in_batch_duplicates_kept_once():
    reqs = _typed_spans()
    t = rows.traces_to_tables(reqs + reqs)
    assert t.spans.num_rows == 2 and t.in_batch_duplicates == 2
    assert t.span_events.num_rows == 2 and t.span_links.num_rows == 1


def test_kvlist_and_empty_values_from_proto():
    reqs = _typed_spans()
    span = reqs[0].resource_spans[0].scope_spans[0].spans[0]
    kv = span.attributes.add()
    kv.key = "nested"
    inner = kv.value.kvlist_value.values.add()
    inner.key = "z"
    inner.value.int_value = 1
    inner = kv.value.kvlist_value.values.add()
    inner.key = "a"
    inner.value.double_value = float("nan")
    empty = span.attributes.add()
    empty.key = "empty"
    t = rows.traces_to_tables(reqs)
    row = [r for r in t.spans.to_pylist() if r["span_id"] == span.span_id.hex()][0]
    assert row["attributes"] == anyvalue.dumps(anyvalue.attrs_from_proto(span.attributes))
    attrs = orjson.loads(row["attributes"])
    assert list(attrs["nested"]["kv"]) == ["a", "z"] and attrs["nested"]["kv"]["a"] == {"d": "NaN"}
    assert attrs["empty"] == {}


def _logs_request():
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    a = rl.resource.attributes.add()
    a.key, a.value.string_value = "service.name", "svc"
    sl = rl.scope_logs.add()
    sl.scope.name = "scope"
    rec = sl.log_records.add()
    rec.time_unix_nano = T0
    rec.severity_number = 9
    rec.event_name = sc.EVENT_INFERENCE_DETAILS
    rec.body.int_value = I64_MAX
    rec.trace_id = bytes(range(16))
    rec.span_id = bytes(range(8))
    b = rec.attributes.add()
    b.key, b.value.bytes_value = "raw", b"\x01\x02"
    rec2 = sl.log_records.add()
    rec2.observed_time_unix_nano = T0 + 5
    return req


def test_logs_rows():
    t = rows.logs_to_tables([_logs_request()])
    recs = t.log_records.to_pylist()
    assert len(recs) == 2
    first, second = recs
    assert len(first["log_id"]) == 64 and first["log_id"] != second["log_id"]
    assert orjson.loads(first["body"]) == {"i": str(I64_MAX)}
    assert first["trace_id"] == bytes(range(16)).hex() and first["span_id"] == bytes(range(8)).hex()
    assert first["service_name"] == "svc" and first["event_name"] == sc.EVENT_INFERENCE_DETAILS
    assert first["date"] == dt.date(2026, 1, 1)
    assert second["body"] is None and second["trace_id"] is None and second["time_unix_nano"] is None
    assert second["observed_time_unix_nano"] == T0 + 5 and second["date"] == dt.date(2026, 1, 1)
    again = rows.logs_to_tables([_logs_request(), _logs_request()])
    assert again.log_records.num_rows == 2 and again.in_batch_duplicates == 2
    assert again.log_records.column("log_id").to_pylist() == [first["log_id"], second["log_id"]]


def test_concat_keeps_each_span_log_and_resource_once():
    reqs = samples.genai_requests(n_runs=2)
    a = rows.traces_to_tables(reqs[:1])
    b = rows.traces_to_tables(reqs)  # run 0 again, plus run 1
    merged = rows.concat([a, b])
    keys = list(zip(merged.spans.column("trace_id").to_pylist(), merged.spans.column("span_id").to_pylist()))
    assert len(keys) == len(set(keys)) == a.spans.num_rows + rows.traces_to_tables(reqs[1:]).spans.num_rows
    assert merged.in_batch_duplicates == a.spans.num_rows
    assert merged.span_events.num_rows == rows.traces_to_tables(reqs).span_events.num_rows
    assert merged.resources.num_rows == 1
    logs = rows.logs_to_tables([_logs_request()])
    both = rows.concat([logs, logs])
    assert both.log_records.num_rows == logs.log_records.num_rows and both.in_batch_duplicates == logs.log_records.num_rows


def _reference_attrs(span) -> str:
    return anyvalue.dumps(anyvalue.attrs_from_proto(span.attributes))


def test_wire_reading_matches_the_shared_encoding_for_any_layout():
    """Attributes read as raw KeyValue bytes (cached or not, canonical or not) encode exactly like
    ``anyvalue`` over the parsed OTLP message; promoted columns follow the last duplicate."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    from otel_agenttape.codec import otlp_view

    wire = otlp_view.parse_traces(_typed_spans()[0].SerializeToString())
    spans = wire.resource_spans[0].scope_spans[0].spans
    for sp in spans:
        sp.attributes.append(KeyValue(key=sc.GEN_AI_REQUEST_MODEL, value={"string_value": "m-1"}).SerializeToString())
        sp.attributes.append(KeyValue(key="long", value={"string_value": "x\"\n" * 200}).SerializeToString())
        sp.attributes.append(KeyValue(key=sc.GEN_AI_REQUEST_MODEL, value={"string_value": "m-2"}).SerializeToString())
        # value before key, and an unknown field: still one KeyValue
        sp.attributes.append(b"\x12\x03\x18\xd2\x09" + b"\x0a\x04late" + b"\x28\x01")
        sp.attributes.append(KeyValue(key=sc.GEN_AI_PROVIDER_NAME).SerializeToString())  # empty: gen_ai.system backs it
    body = wire.SerializeToString()
    for _ in range(2):  # cold and warm caches
        t = rows.traces_to_tables([body])
        by_id = {r["span_id"]: r for r in t.spans.to_pylist()}
        for sp in ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans:
            row = by_id[sp.span_id.hex()]
            assert row["attributes"] == _reference_attrs(sp)
            assert orjson.loads(row["attributes"])["late"] == {"i": "1234"}
            assert row["request_model"] == "m-2"
    child = next(r for r in t.spans.to_pylist() if r["name"] == "chat m")
    assert child["provider_name"] == "openai" and child["input_tokens"] == 12 and child["step"] == 4


def test_wire_reading_rejects_what_otlp_rejects_and_counts_bad_ids():
    import pytest
    from google.protobuf.message import DecodeError

    from otel_agenttape.codec import otlp_view

    body = _typed_spans()[0].SerializeToString()
    wire = otlp_view.parse_traces(body)
    wire.resource_spans[0].scope_spans[0].spans[0].attributes.append(b"\x0a\x02\xff\xfe")  # key not UTF-8
    with pytest.raises(DecodeError):
        rows.traces_to_tables([wire.SerializeToString()])
    with pytest.raises(DecodeError):
        rows.traces_to_tables([b"\x0a\xff\xff"])
    wire = otlp_view.parse_traces(body)
    wire.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x00" * 8
    problems: dict[str, int] = {}
    t = rows.traces_to_tables([wire.SerializeToString()], problems)
    assert problems == {"span_id is all zeros": 1} and t.spans.num_rows == 1
    assert rows.traces_to_tables([wire.SerializeToString()]).spans.num_rows == 2  # no check asked for


def _events_request(segments: list[list[str]]):
    """One request, a span per entry of ``segments``, each span with an event per segment (attributes
    seq + segment, plus a long one on the last event) and a link with attributes."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "svc"
    ss = rs.scope_spans.add()
    for n, segs in enumerate(segments):
        sp = ss.spans.add()
        sp.trace_id, sp.span_id = bytes(15) + b"\x01", (n + 1).to_bytes(8, "big")
        sp.name, sp.start_time_unix_nano, sp.end_time_unix_nano = "chat", T0, T0 + 5
        for i, seg in enumerate(segs):
            ev = sp.events.add()
            ev.name, ev.time_unix_nano = sc.EVENT_TEXT, T0 + i
            a = ev.attributes.add()
            a.key, a.value.int_value = sc.EVENT_SEQ, i
            b = ev.attributes.add()
            b.key, b.value.string_value = sc.EVENT_SEGMENT, seg
            if i == len(segs) - 1:
                c = ev.attributes.add()
                c.key, c.value.string_value = "long", "é\"" * 400
            c = ev.attributes.add()  # a repeated key: the last one wins
            c.key, c.value.double_value = sc.EVENT_SEQ, -0.0 if i % 2 else 0.5
        sp.events.add(name="empty", time_unix_nano=T0)
        ln = sp.links.add(trace_id=bytes(16), span_id=bytes(7) + b"\x09")
        x = ln.attributes.add()
        x.key, x.value.bool_value = "why", bool(n % 2)
    return req


def _check_events_and_links(req, t):
    evs = t.span_events.to_pylist()
    want = [(sp.span_id.hex(), i, anyvalue.dumps(anyvalue.attrs_from_proto(ev.attributes)))
            for sp in req.resource_spans[0].scope_spans[0].spans for i, ev in enumerate(sp.events)]
    assert [(e["span_id"], e["event_index"], e["attributes"]) for e in evs] == want
    links = t.span_links.to_pylist()
    assert [ln["attributes"] for ln in links] == [
        anyvalue.dumps(anyvalue.attrs_from_proto(ln.attributes))
        for sp in req.resource_spans[0].scope_spans[0].spans for ln in sp.links]


def test_event_attribute_sets_cold_warm_and_evicted_match_the_shared_encoding(monkeypatch):
    """Events and links whose raw attributes repeat (cached as a whole set) or differ encode exactly
    like ``anyvalue``, whether the set cache is cold, warm, or cleared because it is full."""
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    same = [["Hello, ", "world."]] * 3
    varied = [["a", "b", "c"], ["a", "x"], ["é\n", "b"], ["\"q\"", "\\"]]
    for segs in (same, varied, same + varied):
        req = _events_request(segs)
        body = req.SerializeToString()
        wirecache.SET_CACHE.clear()
        cold = rows.traces_to_tables([body])
        warm = rows.traces_to_tables([body])
        _check_events_and_links(req, cold)
        for name in ("span_events", "span_links", "spans"):
            assert getattr(warm, name).equals(getattr(cold, name))
    # long sets are left out of the cache; short ones are kept, keyed by their raw KeyValues
    assert wirecache.SET_CACHE and all(sum(map(len, k)) <= wirecache.CACHED_SET_BYTES for k in wirecache.SET_CACHE)
    assert all(v == anyvalue.dumps(anyvalue.attrs_from_proto(KeyValue.FromString(r) for r in k))
               for k, v in wirecache.SET_CACHE.items())
    # a tiny cache is cleared over and over within one request: same rows
    monkeypatch.setattr(wirecache, "CACHE_ENTRIES", 2)
    wirecache.SET_CACHE.clear()
    req = _events_request(same + varied)
    small = rows.traces_to_tables([req.SerializeToString()])
    assert 0 < len(wirecache.SET_CACHE) <= 2
    _check_events_and_links(req, small)


def test_malformed_event_attribute_is_never_cached():
    import pytest
    from google.protobuf.message import DecodeError

    from otel_agenttape.codec import otlp_view

    wire = otlp_view.parse_traces(_events_request([["a"]]).SerializeToString())
    events = wire.resource_spans[0].scope_spans[0].spans[0].events  # serialized events
    ev = otlp_view.Event.FromString(events[0])
    ev.attributes.append(b"\x0a\x02\xff\xfe")
    events[0] = ev.SerializeToString()
    body = wire.SerializeToString()
    for _ in range(3):
        with pytest.raises(DecodeError):
            rows.traces_to_tables([body])
    assert not any(b"\x0a\x02\xff\xfe" in k for k in wirecache.SET_CACHE)
    assert not any(b"\x0a\x02\xff\xfe" in k for k in wirecache.EVENT_CACHE)


def test_table_columns_equal_a_plain_conversion():
    """Columns with one value in every row (repeated in C) equal a row-by-row conversion; floats are
    always converted row by row (0.0 and -0.0 compare equal)."""
    import pyarrow as pa

    sch = rows.SCHEMAS["spans"]
    base = rows.traces_to_tables(_typed_spans()).spans.to_pylist()[0]
    day = (base["date"] - dt.date(1970, 1, 1)).days  # rows carry the day number
    variants = [dict(base), dict(base, duration_ms=-0.0, span_id="0" * 16, chain_seq=None),
                dict(base, duration_ms=0.0, span_id="1" * 16)]
    for rows_ in ([variants[0]] * 3, variants, variants[1:]):
        tuples = [tuple(day if f.name == "date" else r[f.name] for f in sch) for r in rows_]
        got = tables.table("spans", tuples)
        want = pa.Table.from_pylist(rows_, schema=sch)
        assert got.equals(want) and got.schema == sch
        signs = [str(v) for v in got.column("duration_ms").to_pylist()]
        assert signs == [str(r["duration_ms"]) for r in rows_]


def _model_spans_request(n: int, varied: bool, tag: str = "v"):
    """``n`` copies of the sample model span with fresh ids; with ``varied`` each has its own response
    id, message text and event text (the shape of ``bench/ingest.py --varied``)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    base = samples.model_span_request(seed=1)
    span = base.resource_spans[0].scope_spans[0].spans[0]
    req = ExportTraceServiceRequest()
    req.resource_spans.add().CopyFrom(base.resource_spans[0])
    spans = req.resource_spans[0].scope_spans[0].spans
    del spans[:]
    for i in range(n):
        s = spans.add()
        s.CopyFrom(span)
        s.span_id = (i + 1).to_bytes(8, "big")
        if varied:
            token = f"{tag}{i:05d}é"
            for kv in s.attributes:
                if kv.key == sc.GEN_AI_RESPONSE_ID:
                    kv.value.string_value = f"chatcmpl-{token}"
                elif kv.key in (sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES):
                    kv.value.string_value = kv.value.string_value.replace('"content":"', f'"content":"{token} ', 1)
            for ev in s.events:
                for kv in ev.attributes:
                    if kv.value.HasField("string_value"):
                        kv.value.string_value = f"{token} {kv.value.string_value}"
    return req


def _check_against_reference(req, t):
    spans = req.resource_spans[0].scope_spans[0].spans
    by_id = {r["span_id"]: r for r in t.spans.to_pylist()}
    assert len(by_id) == len(spans)
    for sp in spans:
        row = by_id[sp.span_id.hex()]
        assert row["attributes"] == _reference_attrs(sp)
        values = {kv.key: kv.value.string_value for kv in sp.attributes}
        assert row["response_model"] == values[sc.GEN_AI_RESPONSE_MODEL]
        assert row["run_id"] == values[sc.RUN_ID] and row["provider_name"] == values[sc.GEN_AI_PROVIDER_NAME]
    _check_events_and_links(req, t)


def test_varied_and_repeated_spans_match_the_uncached_reference():
    """Spans whose values repeat (served from the caches) and spans whose values never repeat (every
    pair and event set decoded) give the rows of the uncached shared encoding, in any order."""
    varied = _model_spans_request(40, varied=True)
    same = _model_spans_request(40, varied=False)
    assert sum(e.attributes[1].value.string_value.startswith("v00") for e in
               varied.resource_spans[0].scope_spans[0].spans[3].events) >= 1
    for req in (varied, same, varied, same):  # cold, warm, and again after the other kind
        _check_against_reference(req, rows.traces_to_tables([req.SerializeToString()]))


def test_values_that_never_repeat_stay_out_of_the_caches():
    """A pair or an event set enters its cache the second time it is decoded: unique response ids and
    event texts never fill the caches (which would clear the repeated entries with them)."""
    from otel_agenttape.codec import otlp_view

    rows.traces_to_tables([_model_spans_request(3, varied=False).SerializeToString()])  # warm: seen twice
    kv_before, set_before = dict(wirecache.KV_CACHE), dict(wirecache.SET_CACHE)
    event_before = dict(wirecache.EVENT_CACHE)
    assert event_before  # the sample's events repeat
    body = _model_spans_request(200, varied=True, tag="u").SerializeToString()  # not seen by other tests
    rows.traces_to_tables([body])
    wire = otlp_view.parse_traces(body).resource_spans[0].scope_spans[0].spans
    unique_kvs = {r for sp in wire for r in sp.attributes if b"chatcmpl-u" in r}
    unique_sets = {tuple(otlp_view.Event.FromString(ev).attributes[:]) for sp in wire for ev in sp.events}
    unique_events = {ev[9:] for sp in wire for ev in sp.events}
    assert len(unique_kvs) == 200 and len(unique_sets) == 200 * len(wire[0].events)
    assert not unique_kvs & wirecache.KV_CACHE.keys() and not unique_sets & wirecache.SET_CACHE.keys()
    assert not unique_events & wirecache.EVENT_CACHE.keys()
    # the repeated entries are all still there
    assert kv_before.items() <= wirecache.KV_CACHE.items() and set_before.items() <= wirecache.SET_CACHE.items()
    assert event_before.items() <= wirecache.EVENT_CACHE.items()
    assert any(k.startswith(b"\x0a\x10agenttape.run.id") for k in wirecache.KV_CACHE)
    # a value decoded a second time is cached
    rows.traces_to_tables([body])
    assert unique_kvs <= wirecache.KV_CACHE.keys() and unique_events <= wirecache.EVENT_CACHE.keys()


def test_string_values_match_protobuf_and_invalid_ones_raise():
    """A KeyValue with a string value converts as the shared encoding says, whatever its layout, and
    whatever protobuf rejects (invalid UTF-8 in the key or the value, bad lengths) raises
    ``DecodeError``, with cold or warm caches."""
    import pytest
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    def reference(raw: bytes):
        kv = KeyValue.FromString(raw)
        typed = anyvalue.attrs_from_proto([kv])
        return kv.key, anyvalue.dumps(typed)[1:-1]

    def varint(n: int) -> bytes:
        out = b""
        while n >= 128:
            out += bytes([n & 127 | 128])
            n >>= 7
        return out + bytes([n])

    def plain(key: bytes, value: bytes, any_len=None, str_len=None) -> bytes:
        inner = b"\x0a" + (str_len or varint(len(value))) + value
        return b"\x0a" + varint(len(key)) + key + b"\x12" + (any_len or varint(len(inner))) + inner

    texts = ["x", "é\"\\\n\x00", "\U0010ffff\ufffd", "q" * 127, "q" * 130, "w" * 20_000, "z" * 3_000_000]
    good = [KeyValue(key="k", value={"string_value": s}).SerializeToString() for s in texts]
    good += [KeyValue(key="k" * 200, value={"string_value": "v"}).SerializeToString(),  # long key: protobuf
             KeyValue(key="k", value={"string_value": ""}).SerializeToString(),
             plain(b"k", b""),  # string_value set to "" explicitly: {"s": ""}
             plain(b"k", b"ab", any_len=b"\x84\x00"),  # non-minimal length: protobuf reads it
             plain(b"", b"ab"),
             plain(b"k", b"ab") + b"\x18\x01"]  # an unknown field after the value
    for raw in good:
        key, piece = reference(raw)
        assert wirecache.kv_entry(raw)[:2] == (key, piece)
    bad_text = [b"\xff", b"a\xfe", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"]
    bad = [plain(b"k", t) for t in bad_text] + [plain(t, b"v") for t in bad_text]
    bad += [plain(b"k", b"abc")[:-1], plain(b"k", b"abc") + b"\x0a", b"\x0a\x05k", b"\x0a"]
    for raw in bad:
        with pytest.raises(DecodeError):
            KeyValue.FromString(raw)
        with pytest.raises(DecodeError):
            wirecache.kv_entry(raw)
    # through a whole request, warm or cold caches
    from otel_agenttape.codec import otlp_view

    wire = otlp_view.parse_traces(_model_spans_request(2, varied=False).SerializeToString())
    wire.resource_spans[0].scope_spans[0].spans[1].attributes.append(plain(sc.GEN_AI_RESPONSE_ID.encode(), b"\xed\xa0\x80"))
    for _ in range(2):
        with pytest.raises(DecodeError):
            rows.traces_to_tables([wire.SerializeToString()])


def test_events_in_any_layout_match_the_otlp_reading():
    """Events read as raw bytes (served from the event cache or parsed) give the rows the OTLP classes
    give, whatever their layout: time missing, zero, written twice or after the name, unknown fields,
    a name written twice; and what the OTLP classes reject raises, with cold or warm caches."""
    import pytest
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    from otel_agenttape.codec import otlp_view

    def event(**kw) -> bytes:
        return Span.Event(**kw).SerializeToString()

    seq = {"key": sc.EVENT_SEQ, "value": {"int_value": 3}}
    text = {"key": sc.EVENT_SEGMENT, "value": {"string_value": "é\"\n"}}
    plain = event(time_unix_nano=T0 + 1, name="e", attributes=[seq, text])
    tail = plain[9:]
    other_time = b"\x09" + (T0 + 7).to_bytes(8, "little")
    good = [
        plain,
        event(time_unix_nano=T0 + 2, name="e", attributes=[seq, text]),  # same tail, another time
        event(time_unix_nano=2**63 - 1, name="e", attributes=[seq, text]),
        b"\x09" + bytes(8) + tail,  # a zero time written out
        event(name="e", attributes=[seq]),  # no time
        plain + other_time,  # time twice: the last wins
        tail + other_time,  # time after the name
        plain + b"\x28\x01",  # an unknown field
        plain + b"\x12\x01z",  # the name twice: the last wins
        event(time_unix_nano=T0, name="d", dropped_attributes_count=4),
        other_time,  # only a time
        b"",  # an empty event
    ]
    bad = [b"\x09\x01\x02", other_time + b"\x12\x05ab", other_time + b"\x12\x02\xff\xfe",
           other_time + b"\x1a\x04\x0a\x02\xff\xfe"]

    def request(raws: list[bytes]) -> bytes:
        wire = otlp_view.parse_traces(_events_request([[]]).SerializeToString())
        sp = wire.resource_spans[0].scope_spans[0].spans[0]
        del sp.events[:]
        sp.events.extend(raws)
        return wire.SerializeToString()

    body = request(good)
    want_events = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans[0].events
    want = [(ev.time_unix_nano, ev.name, anyvalue.dumps(anyvalue.attrs_from_proto(ev.attributes)),
             ev.dropped_attributes_count) for ev in want_events]
    wirecache.EVENT_CACHE.clear()
    for _ in range(4):  # cold, seen once, cached
        t = rows.traces_to_tables([body])
        got = [(e["time_unix_nano"], e["name"], e["attributes"], e["dropped_attributes_count"])
               for e in t.span_events.to_pylist()]
        assert got == want
        assert [e["event_index"] for e in t.span_events.to_pylist()] == list(range(len(good)))
    assert wirecache.EVENT_CACHE.get(tail) == want[0][1:]
    # only tails in protobuf's own layout are cached
    assert all(k in (tail, good[9][9:]) for k in wirecache.EVENT_CACHE)
    for raw in bad:
        body = request([plain, raw])
        with pytest.raises(DecodeError):
            ExportTraceServiceRequest.FromString(body)
        for _ in range(3):
            with pytest.raises(DecodeError):
                rows.traces_to_tables([body])


def test_string_attributes_read_from_raw_bytes_match_protobuf_at_every_length_boundary():
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from otel_agenttape.store.wirecache import string_kv

    fast = 0
    for length in (0, 1, 5, 126, 127, 128, 129, 16382, 16383, 16384, 16385, 100_000):
        for klen in (0, 1, 5, 127, 128):
            kv = KeyValue(key="k" * klen, value=AnyValue(string_value="é" * (length // 2) + "x" * (length % 2)))
            raw = kv.SerializeToString()
            got = string_kv(raw)
            assert got is None or got == (kv.key, kv.value.string_value), (length, klen)
            fast += got is not None
            assert string_kv(raw + b"\x18\x01") is None  # an unknown trailing field: protobuf decides
            if length:
                assert string_kv(raw[:-1]) is None  # truncated
    assert fast >= 30  # the common layouts take the fast path
    assert string_kv(KeyValue(key="k", value=AnyValue(int_value=5)).SerializeToString()) is None
    bad = KeyValue(key="k", value=AnyValue(string_value="ok")).SerializeToString()[:-2] + b"\xff\xfe"
    assert string_kv(bad) is None  # invalid UTF-8 is left to protobuf, which raises
