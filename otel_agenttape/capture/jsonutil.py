"""JSON encoding of payloads: SDK objects become plain data, strings stay byte-exact."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
_PLAIN = frozenset({str, int, float, bool, dict, list, tuple})


def to_plain(value: Any) -> Any:
    """Turn provider SDK objects (pydantic, dataclasses, protobuf-ish) into dicts/lists."""
    if value is None or type(value) in _PLAIN or isinstance(value, (str, int, float, bool, dict, list, tuple)):
        return value
    for attr in ("model_dump", "to_dict", "dict"):
        method = getattr(value, attr, None)
        if callable(method):
            try:
                return method(mode="json") if attr == "model_dump" else method()
            except TypeError:
                try:
                    return method()
                except Exception:
                    pass
            except Exception:
                pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return value


def _default(value: Any) -> Any:
    plain = to_plain(value)
    if plain is not value:
        return plain
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, (bytes, bytearray)):
        import base64

        return base64.b64encode(bytes(value)).decode("ascii")
    return repr(value)


def dumps(value: Any) -> str:
    """Compact JSON text for any value; never raises for odd objects (falls back to repr)."""
    try:
        # Plain JSON data (the common case) needs no default hook or key coercion.
        return orjson.dumps(value).decode("utf-8")
    except TypeError:
        return orjson.dumps(value, default=_default, option=_OPTS).decode("utf-8")


def payload_text(value: Any) -> str:
    """A payload as an attribute string: strings verbatim (byte-exact), everything else as JSON."""
    if isinstance(value, str):
        return value
    return dumps(value)


def maybe_json(value: Any) -> Any:
    """Parse a JSON string when it is one (tool-call arguments), else return it unchanged."""
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "["):
            try:
                return orjson.loads(text)
            except orjson.JSONDecodeError:
                return value
    return value
