"""JSON encoding of payloads (SDK objects become plain data, strings stay byte-exact) and of rebuilt tape values
(``dump_json``), and JSON text parsed back: ``parse_structured_json`` when recording, ``parse_any_json`` when
reading a tape."""

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


def json_default(value: Any) -> Any:
    """orjson's ``default``: SDK objects as plain data, sets as lists, bytes as base64, else ``repr``."""
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
        return orjson.dumps(value, default=json_default, option=_OPTS).decode("utf-8")


def dump_json(value: Any) -> str:
    """JSON text of a rebuilt tape value (what the commands print, and tool arguments and responses as message
    text): objects with ``to_json()`` as that, bytes as base64, anything else as ``str``. ``dumps`` instead
    writes recorded payloads, where SDK objects become plain data and the last resort is ``repr``."""
    return orjson.dumps(value, default=_tape_default, option=orjson.OPT_NON_STR_KEYS).decode("utf-8")


def _tape_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        import base64

        return base64.b64encode(obj).decode("ascii")
    if hasattr(obj, "to_json"):
        return obj.to_json()
    return str(obj)


def payload_text(value: Any) -> str:
    """A payload as an attribute string: strings verbatim (byte-exact), everything else as JSON."""
    if isinstance(value, str):
        return value
    return dumps(value)


# Two rules for JSON text, one per direction:
# - recording (capture) parses only object/array text: tool-call arguments arrive as JSON text of an object,
#   and a plain string an agent passed ("42", "true") must be recorded as that string, not turned into a number;
# - reading a tape back parses any JSON text, scalars and bytes too: ``payload_text`` wrote every non-string
#   payload as JSON text, and other instrumentations write numbers and quoted strings as JSON text as well.


def parse_structured_json(value: Any) -> Any:
    """Parse a string holding a JSON object or array (tool-call arguments); anything else comes back unchanged."""
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "["):
            return _loads_or(text, value)
    return value


_JSON_START = frozenset('[{"')


def parse_any_json(value: Any) -> Any:
    """Parse JSON text (object, array, string, number, ``true``/``false``/``null``; bytes as UTF-8), as a
    recorded content value is read back; anything else, and text that is not JSON, comes back unchanged."""
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return value
    if isinstance(value, str):
        text = value.strip()
        if text and (text[0] in _JSON_START or text in ("true", "false", "null") or _is_number(text)):
            return _loads_or(text, value)
    return value


def _loads_or(text: str, value: Any) -> Any:
    """``text`` parsed, or ``value`` unchanged when it is not JSON."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
