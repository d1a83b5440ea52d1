"""The compiled span walk (``store/_spanwalk.pyx``) gives exactly the rows of the Python path.

Every case converts the same serialized requests twice, ``compiled=True`` and ``compiled=False``, and
compares all five tables, the duplicate count and the problems, or checks that both refuse the
request. Spans are built by the SDK, by hand with every kind of attribute value, and byte by byte
(unknown fields, repeated fields, fields out of order, wire types that do not match, truncations,
long varints, text that is not UTF-8), the way another encoder or a hostile client could send them.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_agenttape import semconv as sc
from otel_agenttape.codec import otlp_view
from otel_agenttape.store import rows, samples

if rows._spanwalk is None:  # tests/test_native.py fails where it must be built (CI)
    pytest.skip("the compiled span walk is not built (pip install -e . builds it)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from ingest import build_requests  # noqa: E402

TID = bytes(range(1, 17))


def _convert(bodies: list[bytes], compiled: bool, check: bool = True):
    problems: dict[str, int] | None = {} if check else None
    try:
        t = rows.traces_to_tables(bodies, problems, compiled=compiled)
    except DecodeError:
        return "DecodeError"
    except (ValueError, OverflowError) as exc:  # a value no column holds (a kind past int8, a time past 2^63)
        return type(exc).__name__
    return {k: v.to_pylist() for k, v in t.as_dict().items()}, t.in_batch_duplicates, problems


def _same(bodies: list[bytes], check: bool = True) -> object:
    python = _convert(bodies, compiled=False, check=check)
    compiled = _convert(bodies, compiled=True, check=check)
    assert compiled == python
    return python


def _request(spans: list[bytes]) -> bytes:
    """A request holding ``spans`` (serialized, any layout) in one ScopeSpans."""
    req = otlp_view.RawTracesRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="svc")).SerializeToString())
    ss = rs.scope_spans.add()
    ss.scope.name = "scope"
    ss.spans.extend(spans)
    return req.SerializeToString()


def test_bench_requests_repeated_and_varied_give_the_same_rows():
    bodies = build_requests(3, 40, 1) + build_requests(2, 40, 2, varied=True)
    out = _same(bodies)
    assert len(out[0]["spans"]) == 200 and len(out[0]["span_events"]) == 800


def test_sdk_spans_with_links_errors_and_nested_runs_give_the_same_rows():
    from tests.test_store_rows import _typed_spans

    bodies = [r.SerializeToString() for r in _typed_spans()]
    bodies.append(samples.model_span_request(seed=3).SerializeToString())
    out = _same(bodies + bodies)  # the repeats count as duplicates on both paths
    assert out[1] > 0 and out[0]["span_links"]


# --- spans built from the OTLP message, every kind of value -------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["", "é\u2028\x00\x1f\"\\/\x7f", "x" * 300, '{"role":"user","content":"' + "\"q\"\n" * 90 + '"}',
     "".join(map(chr, range(128))) * 3, "ascii then é" + "a" * 300]
)
_keys = st.sampled_from([
    sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_SYSTEM, sc.GEN_AI_PROVIDER_NAME, sc.GEN_AI_REQUEST_MODEL, sc.RUN_ID,
    sc.STEP, sc.GEN_AI_USAGE_INPUT_TOKENS, sc.CHAIN_SEQ, "k", "ü", "long.key." + "z" * 40,
]) | _text


def _scalar() -> st.SearchStrategy[AnyValue]:
    return st.one_of(
        _text.map(lambda s: AnyValue(string_value=s)),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
        st.floats(allow_nan=True).map(lambda d: AnyValue(double_value=d)),
        st.booleans().map(lambda b: AnyValue(bool_value=b)),
        st.binary(max_size=8).map(lambda b: AnyValue(bytes_value=b)),
        st.just(AnyValue()),
        st.lists(_text, max_size=3).map(
            lambda xs: AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=x) for x in xs]))),
        st.lists(st.tuples(_text, _text), max_size=2).map(lambda kvs: AnyValue(kvlist_value=KeyValueList(
            values=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in kvs]))),
    )


_attrs = st.lists(st.tuples(_keys, _scalar()), max_size=8).map(
    lambda kvs: [KeyValue(key=k, value=v) for k, v in kvs])


@st.composite
def _spans(draw: st.DrawFn) -> bytes:
    sp = Span(
        trace_id=draw(st.sampled_from([TID, bytes(16), TID[:15], b""])),
        span_id=draw(st.sampled_from([b"\x01" * 8, b"\x02" * 8, bytes(8), b"\x03" * 7])),
        parent_span_id=draw(st.sampled_from([b"", b"\x09" * 8, b"\x09" * 3])),
        trace_state=draw(_text),
        name=draw(_text),
        kind=draw(st.sampled_from([0, 1, 3, 5, -1, 2**31 - 1])),
        start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        end_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        dropped_attributes_count=draw(st.integers(0, 2**32 - 1)),
        dropped_events_count=draw(st.integers(0, 3)),
        dropped_links_count=draw(st.integers(0, 3)),
        flags=draw(st.integers(0, 2**32 - 1)),
    )
    sp.attributes.extend(draw(_attrs))
    for _ in range(draw(st.integers(0, 3))):
        ev = sp.events.add(time_unix_nano=draw(st.integers(0, 2**64 - 1)), name=draw(_text))
        ev.attributes.extend(draw(_attrs))
    if draw(st.booleans()):
        sp.status.code = draw(st.sampled_from([0, 1, 2, 7]))
        sp.status.message = draw(_text)
    if draw(st.integers(0, 5)) == 0:
        ln = sp.links.add(trace_id=TID, span_id=b"\x05" * 8)
        ln.attributes.extend(draw(_attrs))
    return sp.SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_spans(), min_size=1, max_size=4), st.booleans())
def test_random_spans_give_the_same_rows_problems_and_duplicates(spans: list[bytes], check: bool):
    body = _request(spans)
    _same([body, body], check=check)


# --- spans written byte by byte ---------------------------------------------------------------


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    tag = _varint(number << 3 | wire)
    if wire == 0:
        return tag + _varint(int(payload))
    if wire == 1:
        return tag + struct.pack("<Q", int(payload))
    if wire == 5:
        return tag + struct.pack("<I", int(payload))
    assert isinstance(payload, bytes)
    return tag + _varint(len(payload)) + payload


_KV = KeyValue(key="gen_ai.request.model", value=AnyValue(string_value="m")).SerializeToString()
_LONG_KV = KeyValue(key="gen_ai.input.messages", value=AnyValue(string_value="y" * 400)).SerializeToString()
_EVENT = b"\x09" + struct.pack("<Q", 7) + _field(2, 2, b"ev") + _field(3, 2, _KV)
_STATUS = _field(2, 2, b"oops") + _field(3, 0, 2)

# pieces of a span: each a field as protobuf writes it, or one it reads with care
_PIECES = [
    _field(1, 2, TID), _field(2, 2, b"\x01" * 8), _field(2, 2, b"\x02" * 8), _field(3, 2, b"k=v"),
    _field(4, 2, b"\x09" * 8), _field(5, 2, b"name"), _field(5, 2, "ñame".encode()), _field(5, 2, b"\xff\xfe"),
    _field(5, 2, b"\xed\xa0\x80"), _field(6, 0, 3), _field(6, 0, 2**64 - 1), _field(7, 1, 10**18),
    _field(8, 1, 10**18 + 5), _field(9, 2, _KV), _field(9, 2, _LONG_KV), _field(9, 2, b"\x0a\x01"),
    _field(10, 0, 2**33 + 1), _field(11, 2, _EVENT), _field(11, 2, b"\x09\x01"), _field(12, 0, 1),
    _field(14, 0, 2), _field(15, 2, _STATUS), _field(15, 2, _field(3, 0, 1)), _field(15, 2, _field(9, 0, 1)),
    _field(15, 2, _field(2, 0, 1)), _field(15, 2, _field(2, 2, b"\xc0\xaf")), _field(16, 5, 0x301),
    _field(13, 2, _field(1, 2, TID) + _field(2, 2, b"\x04" * 8)),
    # known fields with another wire type, unknown fields of every wire type, groups, field 0
    _field(5, 0, 1), _field(7, 0, 1), _field(16, 0, 1), _field(6, 2, b"\x01"), _field(9, 0, 1),
    _field(99, 0, 5), _field(99, 1, 5), _field(99, 2, b"zz"), _field(99, 5, 5), _field(17, 2, b""),
    _varint(99 << 3 | 3) + _varint(99 << 3 | 4), _varint(0 << 3 | 0) + b"\x00", _varint(7 << 3 | 6),
    # long and overlong varints
    _varint(6 << 3 | 0) + b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    _varint(6 << 3 | 0) + b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x02",
    _varint(6 << 3 | 0) + b"\x81\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    b"\x8a\x80\x80\x80\x00" + _varint(2) + b"ab",  # field 1 with a five-byte tag
]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_PIECES), max_size=14), st.integers(0, 3), st.booleans())
def test_spans_in_any_byte_layout_give_the_same_rows_or_the_same_refusal(pieces: list[bytes], cut: int, check: bool):
    base = _field(1, 2, TID) + _field(2, 2, b"\x01" * 8) + _field(7, 1, 5)
    raw = base + b"".join(pieces)
    if cut:
        raw = raw[:-cut]  # a field that runs past the end of its span
    _same([_request([raw, base])], check=check)


def test_layouts_the_walk_leaves_to_protobuf_still_convert():
    """A repeated status merges, the last name wins, an unknown field is skipped: as protobuf reads it."""
    base = _field(1, 2, TID) + _field(2, 2, b"\x01" * 8)
    raw = (base + _field(15, 2, _field(2, 2, b"first")) + _field(5, 2, b"a") + _field(99, 2, b"?")
           + _field(15, 2, _field(3, 0, 2)) + _field(5, 2, b"b"))
    out = _same([_request([raw])])
    (span,) = out[0]["spans"]
    assert (span["name"], span["status_code"], span["status_message"]) == ("b", 2, "first")


def test_text_that_is_not_utf8_is_refused_even_when_a_later_value_replaces_it():
    base = _field(1, 2, TID) + _field(2, 2, b"\x01" * 8)
    assert _same([_request([base + _field(5, 2, b"\xff") + _field(5, 2, b"ok")])]) == "DecodeError"


def test_requiring_the_compiled_walk_when_it_is_built():
    body = build_requests(1, 3, 1)[0]
    assert rows.traces_to_tables([body], compiled=True).spans.num_rows == 3


# pieces of an event: its fields as protobuf writes them, and ones it reads with care
_EVENT_PIECES = [
    b"\x09" + struct.pack("<Q", 11), _field(1, 1, 12), _field(2, 2, b"tool.result"), _field(2, 2, b"\xff"),
    _field(2, 2, "é".encode()), _field(3, 2, _KV), _field(3, 2, _LONG_KV), _field(3, 2, b"\x0a\x01"),
    _field(3, 2, KeyValue(key="n", value=AnyValue(int_value=3)).SerializeToString()), _field(4, 0, 2),
    _field(4, 0, 2**40), _field(1, 0, 5), _field(2, 0, 1), _field(3, 0, 1), _field(4, 2, b"x"), _field(4, 5, 1),
    _field(9, 2, b"?"), _field(9, 0, 1), _field(9, 1, 1), _field(9, 5, 1), _varint(9 << 3 | 3), b"\x00",
]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(_EVENT_PIECES), max_size=6), max_size=3), st.integers(0, 2))
def test_events_in_any_byte_layout_give_the_same_rows_or_the_same_refusal(events: list[list[bytes]], cut: int):
    base = _field(1, 2, TID) + _field(2, 2, b"\x01" * 8) + _field(7, 1, 5)
    raws = [b"".join(ev) for ev in events]
    if cut and raws and raws[-1]:
        raws[-1] = raws[-1][:-cut]
    span = base + b"".join(_field(11, 2, r) for r in raws)
    # twice: the second time an event's tail may come from the cache
    _same([_request([span]), _request([span.replace(b"\x01" * 8, b"\x02" * 8, 1)])])


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=160), st.binary(max_size=60))
def test_arbitrary_bytes_after_valid_ids_give_the_same_rows_or_the_same_refusal(tail: bytes, event: bytes):
    base = _field(1, 2, TID) + _field(2, 2, b"\x01" * 8)
    _same([_request([base + tail, base.replace(b"\x01" * 8, b"\x02" * 8) + _field(11, 2, event)])])


def test_spans_with_more_attributes_or_events_than_the_walk_holds_still_convert():
    many = 600  # past the walk's 512 per span: the Python path takes the span
    attrs = b"".join(_field(9, 2, KeyValue(key=f"k{i}", value=AnyValue(int_value=i)).SerializeToString())
                     for i in range(many))
    events = b"".join(_field(11, 2, _EVENT.replace(b"ev", b"e%d" % (i % 10), 1)) for i in range(many))
    base = _field(1, 2, TID) + _field(2, 2, b"\x01" * 8)
    out = _same([_request([base + attrs, base.replace(b"\x01" * 8, b"\x02" * 8) + events])])
    assert len(out[0]["span_events"]) == many


def test_columns_transposes_rows_of_one_width_and_leaves_anything_else_to_zip():
    columns = rows._spanwalk.columns
    assert columns([(1, "a", None), (2, "b", 3.5)], 3) == [[1, 2], ["a", "b"], [None, 3.5]]
    assert columns([], 2) == [[], []]
    assert columns([(1, 2), (3,)], 2) is None
    assert columns([[1, 2]], 2) is None
