"""Typed attribute values: the one JSON encoding shared by the store and the canonical leaf.

OTLP keeps an int apart from a double and bytes apart from strings; plain JSON does not. Integrity
verification recomputes hashes from stored rows, so the store keeps every value in this typed form
and the canonical leaf hashes the very same form. Each value is a one-key JSON object:

=============  ============================  ===========================================
OTLP type      typed form                    notes
=============  ============================  ===========================================
string         ``{"s": "text"}``
bool           ``{"bool": true}``
int            ``{"i": "-42"}``              decimal string: int64 never loses precision
double         ``{"d": "1.5"}``              shortest repr; ``"-0.0"``, ``"NaN"``, ``"Infinity"``
bytes          ``{"b": "AAE="}``             standard base64 with padding
array          ``{"a": [typed, ...]}``
kvlist         ``{"kv": {"key": typed}}``    keys sorted by code point; on duplicates the last wins
empty          ``{}``                        an AnyValue with no value set
=============  ============================  ===========================================

An attribute set is ``{"key": typed, ...}`` with the same key rules as ``kv``.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

Typed = dict[str, Any]

_EMPTY: Typed = {}


def encode_double(value: float) -> str:
    """Render a double so that it round-trips exactly and -0.0/NaN/Inf stay distinct."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(float(value))


def decode_double(text: str) -> float:
    if text == "NaN":
        return math.nan
    if text == "Infinity":
        return math.inf
    if text == "-Infinity":
        return -math.inf
    return float(text)


def from_python(value: Any) -> Typed:
    """Encode an OpenTelemetry SDK attribute value (str, bool, int, float, bytes, list, dict)."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"s": value}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"i": str(value)}
    if isinstance(value, float):
        return {"d": encode_double(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {"kv": attrs_from_python(value)}
    if isinstance(value, (list, tuple, Sequence)):
        return {"a": [from_python(v) for v in value]}
    return {"s": str(value)}


def attrs_from_python(attributes: Mapping[str, Any] | None) -> dict[str, Typed]:
    if not attributes:
        return {}
    return {str(k): from_python(attributes[k]) for k in sorted(attributes, key=str)}


def from_proto(value: Any) -> Typed:
    """Encode an ``opentelemetry.proto.common.v1.AnyValue`` message."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return {"s": value.string_value}
    if which == "int_value":
        return {"i": str(value.int_value)}
    if which == "double_value":
        return {"d": encode_double(value.double_value)}
    if which == "bool_value":
        return {"bool": value.bool_value}
    if which == "bytes_value":
        return {"b": base64.b64encode(value.bytes_value).decode("ascii")}
    if which == "array_value":
        return {"a": [from_proto(v) for v in value.array_value.values]}
    if which == "kvlist_value":
        return {"kv": attrs_from_proto(value.kvlist_value.values)}
    return {}


def attrs_from_proto(key_values: Iterable[Any]) -> dict[str, Typed]:
    """Encode a repeated ``KeyValue``; duplicate keys keep the last value."""
    out: dict[str, Typed] = {}
    for kv in key_values:
        out[kv.key] = from_proto(kv.value)
    return {k: out[k] for k in sorted(out)}


def to_proto(typed: Typed, target: Any) -> None:
    """Fill an ``AnyValue`` message from a typed value (used to re-export stored rows)."""
    if "s" in typed:
        target.string_value = typed["s"]
    elif "i" in typed:
        target.int_value = int(typed["i"])
    elif "d" in typed:
        target.double_value = decode_double(typed["d"])
    elif "bool" in typed:
        target.bool_value = typed["bool"]
    elif "b" in typed:
        target.bytes_value = base64.b64decode(typed["b"])
    elif "a" in typed:
        arr = target.array_value
        arr.SetInParent()
        for item in typed["a"]:
            to_proto(item, arr.values.add())
    elif "kv" in typed:
        kvl = target.kvlist_value
        kvl.SetInParent()
        for key, item in typed["kv"].items():
            kv = kvl.values.add()
            kv.key = key
            to_proto(item, kv.value)


def to_python(typed: Typed | None) -> Any:
    """Decode to a plain Python value (int, float, str, bool, bytes, list, dict, None)."""
    if not typed:
        return None
    if "s" in typed:
        return typed["s"]
    if "i" in typed:
        return int(typed["i"])
    if "d" in typed:
        return decode_double(typed["d"])
    if "bool" in typed:
        return bool(typed["bool"])
    if "b" in typed:
        return base64.b64decode(typed["b"])
    if "a" in typed:
        return [to_python(v) for v in typed["a"]]
    if "kv" in typed:
        return {k: to_python(v) for k, v in typed["kv"].items()}
    return None


def attrs_to_python(attrs: Mapping[str, Typed] | str | bytes | None) -> dict[str, Any]:
    """Decode an attribute set (a dict or its JSON text, as stored) to plain Python values."""
    if attrs is None:
        return {}
    if isinstance(attrs, (str, bytes)):
        attrs = orjson.loads(attrs)
    return {k: to_python(v) for k, v in attrs.items()}


def dumps(attrs: Mapping[str, Typed]) -> str:
    """Serialize an attribute set for storage (compact, UTF-8 safe)."""
    return orjson.dumps(attrs).decode("utf-8")


def loads(text: str | bytes | None) -> dict[str, Typed]:
    if not text:
        return {}
    return orjson.loads(text)


def as_text(typed: Typed | None) -> str | None:
    """Best-effort string view of a value, for promoted columns and display.

    Strings come back as is; anything structured comes back as JSON text.
    """
    if not typed:
        return None
    if "s" in typed:
        return typed["s"]
    value = to_python(typed)
    if isinstance(value, (dict, list)):
        return orjson.dumps(value, default=_json_default).decode("utf-8")
    if isinstance(value, bytes):
        return typed["b"]
    return str(value).lower() if isinstance(value, bool) else str(value)


def as_int(typed: Typed | None) -> int | None:
    """Integer view for promoted numeric columns: ints as is, integral doubles and digit strings."""
    if not typed:
        return None
    if "i" in typed:
        return int(typed["i"])
    if "d" in typed:
        v = decode_double(typed["d"])
        return int(v) if math.isfinite(v) and v == int(v) else None
    if "s" in typed and typed["s"].lstrip("-").isdigit():
        return int(typed["s"])
    return None


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode("ascii")
    if isinstance(obj, float):
        return encode_double(obj)
    raise TypeError(type(obj).__name__)
