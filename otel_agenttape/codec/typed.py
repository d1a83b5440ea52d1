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

``from_python`` is lenient (anything becomes some typed value, as the store needs); ``strict_from_python``
refuses what OTLP cannot carry as is (``NotOtlpSafe``), and ``otlp_safe`` turns such a value into one it
can, as the canonical leaf and sealing need.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

Typed = dict[str, Any]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_b64 = base64.b64encode


class NotOtlpSafe(ValueError):
    """A live attribute value that OTLP cannot carry as is (huge int, lone surrogate, odd type)."""


def encode_double(value: float) -> str:
    """Render a double so that it round-trips exactly and -0.0/NaN/Inf stay distinct."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(float(value))  # -0.0 stays "-0.0"


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


def strict_from_python(value: Any, order: Callable[[Iterable[str]], list[str]] = sorted) -> Typed:
    """Typed form of an SDK attribute value, its maps' keys in ``order``; raises ``NotOtlpSafe`` for a
    value OTLP cannot carry as is (an int outside int64, a map with a key that is not a string, an
    unknown type). Only exact types are taken: a subclass of str or int is not what the SDK sends."""
    t = type(value)
    if t is str:
        return {"s": value}
    if t is bool:
        return {"bool": value}
    if t is int:
        if INT64_MIN <= value <= INT64_MAX:
            return {"i": str(value)}
        raise NotOtlpSafe("integer outside int64")
    if t is float:
        return {"d": encode_double(value)}
    if t is tuple or t is list:
        return {"a": [strict_from_python(v, order) for v in value]}
    if t is bytes:
        return {"b": _b64(value).decode("ascii")}
    if value is None:
        return {}
    if isinstance(value, Mapping):
        for k in value:
            if type(k) is not str:
                raise NotOtlpSafe("non-string map key")
        return {"kv": {k: strict_from_python(value[k], order) for k in order(value)}}
    raise NotOtlpSafe(f"unsupported type {t.__name__}")


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


def to_otlp_json(typed: Typed) -> dict[str, Any]:
    """The OTLP JSON ``AnyValue`` of a typed value (ints as decimal strings, bytes as base64, as OTLP
    JSON writes them; NaN and the infinities as their names)."""
    if "s" in typed:
        return {"stringValue": typed["s"]}
    if "i" in typed:
        return {"intValue": str(typed["i"])}
    if "d" in typed:
        d = typed["d"]
        return {"doubleValue": d if d in ("NaN", "Infinity", "-Infinity") else decode_double(d)}
    if "bool" in typed:
        return {"boolValue": bool(typed["bool"])}
    if "b" in typed:
        return {"bytesValue": typed["b"]}
    if "a" in typed:
        return {"arrayValue": {"values": [to_otlp_json(v) for v in typed["a"]]}}
    if "kv" in typed:
        return {"kvlistValue": {"values": attrs_to_otlp_json(typed["kv"])}}
    return {}


def attrs_to_otlp_json(attrs: Mapping[str, Typed]) -> list[dict[str, Any]]:
    """An attribute set as OTLP JSON ``KeyValue`` objects."""
    return [{"key": k, "value": to_otlp_json(v)} for k, v in attrs.items()]


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
    # text, most values, read in place: ``to_python`` would read it first too
    return {k: v["s"] if type(v) is dict and "s" in v else to_python(v) for k, v in attrs.items()}


def dumps(attrs: Mapping[str, Typed]) -> str:
    """Serialize an attribute set for storage (compact, UTF-8 safe)."""
    return orjson.dumps(attrs).decode("utf-8")


def loads(text: str | bytes | None) -> dict[str, Typed]:
    if not text:
        return {}
    return orjson.loads(text)


def as_text(t: Typed | None) -> str | None:
    """The text view of a value, as a promoted text column of the store holds it: strings as is, ints and
    doubles in their typed text, bools as ``true``/``false``, anything else as its typed JSON."""
    if not t:
        return None
    s = t.get("s")
    if s is not None:
        return s
    if "i" in t:
        return t["i"]
    if "d" in t:
        return t["d"]
    if "bool" in t:
        return "true" if t["bool"] else "false"
    return orjson.dumps(t, option=orjson.OPT_SORT_KEYS).decode()


def as_int(t: Typed | None) -> int | None:
    """The int view of a value, as a promoted int column (BIGINT) of the store holds it: ints, integral
    doubles and digit strings; None when the value holds no int64."""
    if not t:
        return None
    i = t.get("i")
    if i is not None:
        return int(i)
    if "d" in t:
        try:
            v = float(t["d"])
        except ValueError:
            return None
        if not (math.isfinite(v) and v == int(v)):
            return None
        n = int(v)
    else:
        s = t.get("s")
        if s is None or not s.lstrip("-").isdigit():
            return None
        try:
            n = int(s)
        except ValueError:
            return None
    return n if INT64_MIN <= n <= INT64_MAX else None


# --- making live values OTLP-safe -----------------------------------------------------------------


def clean_text(text: str) -> str:
    """Join surrogate pairs and replace each unpaired surrogate with U+FFFD (OTLP strings are UTF-8)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def otlp_safe(value: Any) -> Any:
    """The value an OTLP exporter can send unchanged and the leaf hashes.

    Integers outside int64 become their decimal string, text gets ``clean_text``, map keys become
    cleaned strings (on a clash the later one wins, as OTLP decoders do), bytes-likes become bytes,
    unknown types their ``str``.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return clean_text(str.__str__(value))
    if isinstance(value, int):
        v = int(value)
        return v if INT64_MIN <= v <= INT64_MAX else str(v)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, Mapping):
        return {clean_text(str(k)): otlp_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (isinstance(value, Sequence)):
        return tuple(otlp_safe(v) for v in value)
    return clean_text(str(value))


def otlp_safe_attributes(attrs: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """Make every attribute OTLP-safe; returns the new attributes and the (cleaned) keys that changed."""
    out: dict[str, Any] = {}
    changed: list[str] = []
    for k, v in (attrs or {}).items():
        key = clean_text(str(k))
        safe = otlp_safe(v)
        if key != k or not _same_typed(v, safe):
            changed.append(key)
        out[key] = safe
    return out, changed


def _same_typed(original: Any, safe: Any) -> bool:
    try:
        return strict_from_python(original) == strict_from_python(safe)
    except NotOtlpSafe:
        return False
