"""The typed value encoding keeps OTLP types apart, from Python values and from protobuf."""

import math

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from otel_agenttape.codec import typed as anyvalue


def test_int_and_double_stay_distinct():
    assert anyvalue.from_python(1) == {"i": "1"}
    assert anyvalue.from_python(1.0) == {"d": "1.0"}
    assert anyvalue.from_python(True) == {"bool": True}
    assert anyvalue.from_python(-0.0) == {"d": "-0.0"}
    assert anyvalue.from_python(math.nan) == {"d": "NaN"}
    assert anyvalue.from_python(-math.inf) == {"d": "-Infinity"}


def test_python_and_proto_agree_and_round_trip():
    value = {"b": [1, 2.5, "x", b"\x00\xff", True], "a": {"z": None}}
    typed = anyvalue.from_python(value)
    msg = AnyValue()
    anyvalue.to_proto(typed, msg)
    assert anyvalue.from_proto(msg) == typed
    assert anyvalue.to_python(typed) == value


def test_attrs_sorted_last_duplicate_wins():
    kvs = [KeyValue(key="b", value=AnyValue(int_value=1)), KeyValue(key="a", value=AnyValue(string_value="x")),
           KeyValue(key="b", value=AnyValue(int_value=2))]
    attrs = anyvalue.attrs_from_proto(kvs)
    assert list(attrs) == ["a", "b"]
    assert attrs["b"] == {"i": "2"}
    assert anyvalue.attrs_to_python(anyvalue.dumps(attrs)) == {"a": "x", "b": 2}


def test_int64_extremes_survive_text():
    big = 2**63 - 1
    msg = AnyValue(int_value=big)
    typed = anyvalue.from_proto(msg)
    assert typed == {"i": str(big)}
    assert anyvalue.to_python(anyvalue.loads(anyvalue.dumps({"k": typed}))["k"]) == big


def test_the_first_module_name_still_works():
    """``otel_agenttape.anyvalue`` (named by earlier docs) gives the same functions."""
    from otel_agenttape import anyvalue as old

    assert old.from_python is anyvalue.from_python and old.attrs_to_python is anyvalue.attrs_to_python


@pytest.mark.parametrize("value", ["x", 7, -(2**63), 1.5, -0.0, math.inf, True, b"\x00\xff", [1, "a", [2.5]], {"k": {"n": 1}}])
def test_otlp_json_reads_back_as_the_same_typed_value(value):
    from google.protobuf import json_format

    typed = anyvalue.from_python(value)
    msg = json_format.ParseDict(anyvalue.to_otlp_json(typed), AnyValue())
    assert anyvalue.from_proto(msg) == typed
