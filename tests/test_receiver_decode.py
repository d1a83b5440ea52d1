"""OTLP decoding: protobuf, OTLP JSON quirks, compression limits, validation."""

from __future__ import annotations

import base64
import gzip
import json
import zlib

import pytest
from receiver_util import logs_request, trace_request

from otel_agenttape.codec.otlp_decode import (
    BodyTooLarge,
    DecodeError,
    UnsupportedMediaType,
    decode_logs,
    decode_traces,
    decompress,
    media_type,
)
from otel_agenttape.receiver.validation import validate_logs, validate_traces

TID = "5B8EFFF798038103D269B633813FC60C"
SID = "EEE19B7EC3C1B174"


def _json_span(**over):
    span = {
        "traceId": TID,
        "spanId": SID,
        "parentSpanId": "",
        "name": "chat m",
        "kind": 3,
        "startTimeUnixNano": "1544712660000000000",
        "endTimeUnixNano": 1544712661000000001,
        "attributes": [
            {"key": "i", "value": {"intValue": "9007199254740993"}},
            {"key": "d", "value": {"doubleValue": 1.0}},
            {"key": "b", "value": {"bytesValue": base64.b64encode(b"\x00\x01\xff").decode()}},
            {"key": "kv", "value": {"kvlistValue": {"values": [{"key": "x", "value": {"boolValue": True}}]}}},
        ],
        "status": {"code": 2, "message": "boom"},
        "someFutureField": {"nested": 1},
    }
    span.update(over)
    return span


def _json_req(*spans):
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}).encode()


def test_json_quirks_decode_to_proto():
    req = decode_traces(_json_req(_json_span()), "application/json; charset=utf-8")
    span = req.resource_spans[0].scope_spans[0].spans[0]
    assert span.trace_id.hex() == TID.lower()
    assert span.span_id.hex() == SID.lower()
    assert span.parent_span_id == b""
    assert span.kind == 3 and span.status.code == 2
    assert span.start_time_unix_nano == 1544712660000000000
    assert span.end_time_unix_nano == 1544712661000000001
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["i"].int_value == 9007199254740993
    assert attrs["d"].WhichOneof("value") == "double_value"
    assert attrs["b"].bytes_value == b"\x00\x01\xff"
    assert attrs["kv"].kvlist_value.values[0].value.bool_value is True
    v = validate_traces(req)
    assert (v.accepted, v.rejected) == (1, 0)


def test_lowercase_and_uppercase_hex_are_the_same_ids():
    a = decode_traces(_json_req(_json_span()), "application/json")
    b = decode_traces(_json_req(_json_span(traceId=TID.lower(), spanId=SID.lower())), "application/json")
    assert a == b


@pytest.mark.parametrize(
    "span",
    [
        _json_span(traceId="zz" * 16),  # not hex
        _json_span(spanId="abc"),  # odd length
        _json_span(traceId=12345),  # wrong type
        _json_span(startTimeUnixNano="soon"),  # int64 not a number
        _json_span(kind={"x": 1}),  # enum of the wrong type
        _json_span(attributes={"not": "a list"}),
        _json_span(name=["x"]),
    ],
)
def test_undecodable_json_raises(span):
    with pytest.raises(DecodeError):
        decode_traces(_json_req(span), "application/json")


@pytest.mark.parametrize("body", [b"{", b"[1,2]", b'{"resourceSpans": 5}', b'{"resourceSpans": [{"scopeSpans": [7]}]}'])
def test_malformed_json_documents(body):
    with pytest.raises(DecodeError):
        decode_traces(body, "application/json")


def test_protobuf_roundtrip_and_garbage():
    req = trace_request(4)
    assert decode_traces(req.SerializeToString(), "application/x-protobuf") == req
    with pytest.raises(DecodeError):
        decode_traces(b"\x0a\xff\xff\xff\xff\x0f garbage", "application/x-protobuf")


def test_validation_removes_only_invalid_spans():
    req = trace_request(5)
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[1].span_id = b"\x01\x02\x03"  # wrong length
    spans[3].trace_id = bytes(16)  # all-zero trace id
    v = validate_traces(req)
    assert (v.accepted, v.rejected, v.changed) == (3, 2, True)
    assert "span_id must be 8 bytes" in v.message and "trace_id is all zeros" in v.message
    assert len(req.resource_spans[0].scope_spans[0].spans) == 3


def test_validation_of_logs():
    req = logs_request(3)
    req.resource_logs[0].scope_logs[0].log_records[0].trace_id = b"\x01" * 5
    req.resource_logs[0].scope_logs[0].log_records[1].ClearField("trace_id")  # ids are optional on logs
    req.resource_logs[0].scope_logs[0].log_records[1].ClearField("span_id")
    v = validate_logs(decode_logs(req.SerializeToString(), "application/x-protobuf"))
    assert (v.accepted, v.rejected) == (2, 1)


def test_logs_json_ids_are_hex():
    body = json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"traceId": TID, "spanId": SID, "eventName": "e", "body": {"stringValue": "hi"}, "severityNumber": 9}
    ]}]}]}).encode()
    rec = decode_logs(body, "application/json").resource_logs[0].scope_logs[0].log_records[0]
    assert rec.trace_id.hex() == TID.lower() and rec.severity_number == 9 and rec.event_name == "e"


def test_media_types():
    assert media_type("application/x-protobuf") == "application/x-protobuf"
    assert media_type("Application/JSON; charset=utf-8") == "application/json"
    for bad in ("text/plain", "", None, "application/xml"):
        with pytest.raises(UnsupportedMediaType):
            media_type(bad)


def test_gzip_and_deflate_and_limits():
    data = b"x" * 1000
    assert decompress(gzip.compress(data), "gzip", 2000) == data
    assert decompress(zlib.compress(data), "deflate", 2000) == data
    with pytest.raises(BodyTooLarge):
        decompress(data, None, 999)
    with pytest.raises(BodyTooLarge):
        decompress(gzip.compress(data), "gzip", 999)
    with pytest.raises(DecodeError):
        decompress(b"not gzip at all", "gzip", 2000)
    with pytest.raises(DecodeError):
        decompress(gzip.compress(data)[:-12], "gzip", 2000)  # truncated
    with pytest.raises(UnsupportedMediaType):
        decompress(data, "br", 2000)


def test_gzip_bomb_is_refused_without_inflating_it_all():
    bomb = gzip.compress(b"\0" * (200 << 20), compresslevel=9)  # 200 MiB of zeros in ~200 KB
    assert len(bomb) < 1 << 20
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(BodyTooLarge):
        decompress(bomb, "gzip", 20 << 20)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 40 << 20  # never held the 200 MiB
