"""OTLP request decoding: protobuf or OTLP JSON (+gzip/deflate) into the collector request messages.

``decode_*`` raises ``DecodeError`` when the body cannot be read as a request at all (the receiver
answers the whole request with a 400). OTLP JSON items whose ids are not hex, or whose strings are not
UTF-8, can instead be left out and counted by reason (``problems``), so that the rest is stored and
the client told with a partial success; which decoded items the store can hold is the receiver's
``validation``.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError as _ProtoDecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

TRACES = "traces"  # the two signals, as OTLP/HTTP paths name them
LOGS = "logs"
BAD_UTF8 = "a string that is not valid UTF-8"
_INFLATE_CHUNK = 256 * 1024


class DecodeError(ValueError):
    """The body is not a decodable OTLP request (answered with HTTP 400 / INVALID_ARGUMENT)."""


class UnsupportedMediaType(ValueError):
    """Content type or content encoding the receiver does not read (HTTP 415)."""


class BodyTooLarge(ValueError):
    """Body over the limit, before or after decompression (HTTP 413 / RESOURCE_EXHAUSTED)."""


class TooManyItems(BodyTooLarge):
    """More spans or log records in one request than ``max_spans_per_request`` (HTTP 413 / INVALID_ARGUMENT:
    a request that can never be accepted must not be retried)."""


def too_many(count: int, limit: int, noun: str = "spans") -> TooManyItems:
    shown = f"more than {limit:,}" if count > limit else f"{count:,}"
    return TooManyItems(f"{shown} {noun} in one request exceed the limit of {limit:,} per request; "
                        "send smaller batches")


def media_type(content_type: str | None) -> str:
    """Return ``application/x-protobuf`` or ``application/json`` for a Content-Type header."""
    base = (content_type or "").split(";", 1)[0].strip().lower()
    if base in (PROTOBUF, "application/protobuf", "application/vnd.google.protobuf"):
        return PROTOBUF
    if base == JSON:
        return JSON
    raise UnsupportedMediaType(f"unsupported content type {content_type!r}; use {PROTOBUF} or {JSON}")


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Inflate a gzip/deflate body, refusing once the output passes ``limit`` (a bomb is never fully inflated)."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        if len(body) > limit:
            raise BodyTooLarge(f"request body of {len(body)} bytes exceeds the limit of {limit} bytes")
        return body
    if enc in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif enc == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise UnsupportedMediaType(f"unsupported content encoding {encoding!r}; use gzip, deflate or identity")
    d = zlib.decompressobj(wbits)
    out: list[bytes] = []
    total = 0
    data = body
    try:
        while data:
            chunk = d.decompress(data, _INFLATE_CHUNK)
            total += len(chunk)
            if total > limit:
                raise BodyTooLarge(f"decompressed request body exceeds the limit of {limit} bytes")
            out.append(chunk)
            data = d.unconsumed_tail
            if d.eof:
                break
        if not d.eof:
            raise DecodeError(f"truncated {enc} body")
    except zlib.error as exc:
        raise DecodeError(f"invalid {enc} body: {exc}") from None
    return b"".join(out)


# --- OTLP JSON -------------------------------------------------------------------------------


def loads_lenient(body: bytes) -> Any:
    """Parse JSON whose strings may hold bytes that are not UTF-8 or lone surrogate escapes (each
    becomes a lone surrogate, which ``has_bad_string`` finds); None when it is not JSON at all."""
    try:
        return json.loads(body.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None


def has_bad_string(value: Any) -> bool:
    """True when a JSON value holds a string (or key) that is not valid Unicode text."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def drop_bad_strings(items: list[Any], problems: dict[str, int]) -> None:
    """Remove (and count) the JSON items with a string that is not valid UTF-8."""
    bad = [i for i, item in enumerate(items) if has_bad_string(item)]
    for i in reversed(bad):
        del items[i]
    if bad:
        problems[BAD_UTF8] = problems.get(BAD_UTF8, 0) + len(bad)


_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")


def _id_problem(obj: dict[str, Any], key: str) -> str | None:
    """Turn a hex id into the base64 the protobuf JSON parser reads; or say why it is not an id."""
    value = obj.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        return f"{_snake(key)} must be a hex string, got {type(value).__name__}"
    if _HEX.fullmatch(value) is None:  # bytes.fromhex would skip spaces: ids are strict
        return f"{_snake(key)} is not a hex string"
    obj[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
    return None


def _snake(key: str) -> str:
    return {"traceId": "trace_id", "spanId": "span_id", "parentSpanId": "parent_span_id"}.get(key, key)


def _items(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DecodeError(f"{where}.{key} must be an array")
    for item in value:
        if not isinstance(item, dict):
            raise DecodeError(f"{where}.{key} must hold objects")
    return value


_SPAN_IDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")
_TRACE_AND_SPAN_IDS = ("traceId", "spanId", "trace_id", "span_id")


def _first_id_problem(obj: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """Convert the ids under ``keys`` in order; the first one that is not an id says why."""
    for key in keys:
        why = _id_problem(obj, key)
        if why is not None:
            return why
    return None


def _span_id_problem(span: dict[str, Any], where: str) -> str | None:
    why = _first_id_problem(span, _SPAN_IDS)
    if why is not None:
        return why
    for link in _items(span, "links", where):
        why = _first_id_problem(link, _TRACE_AND_SPAN_IDS)
        if why is not None:
            return f"link {why}"
    return None


def _log_id_problem(rec: dict[str, Any], where: str) -> str | None:
    return _first_id_problem(rec, _TRACE_AND_SPAN_IDS)


def _fix_ids(items: list[Any], where: str, problem: Any, problems: dict[str, int] | None) -> None:
    """Convert the hex ids of ``items`` in place; an item whose ids are not hex is removed and counted
    in ``problems`` (partial success), or, with no ``problems`` to count in, fails the request."""
    bad = []
    for i, item in enumerate(items):
        why = problem(item, f"{where}[{i}]")
        if why is not None:
            if problems is None:
                raise DecodeError(f"{where}[{i}]: {why}")
            problems[why] = problems.get(why, 0) + 1
            bad.append(i)
    for i in reversed(bad):
        del items[i]


def _fix_trace_ids(doc: dict[str, Any], problems: dict[str, int] | None = None) -> None:
    for r, rs in enumerate(_items(doc, "resourceSpans", "request")):
        for s, ss in enumerate(_items(rs, "scopeSpans", f"resourceSpans[{r}]")):
            where = f"resourceSpans[{r}].scopeSpans[{s}].spans"
            _fix_ids(_items(ss, "spans", f"resourceSpans[{r}].scopeSpans[{s}]"), where, _span_id_problem, problems)


def _fix_log_ids(doc: dict[str, Any], problems: dict[str, int] | None = None) -> None:
    for r, rl in enumerate(_items(doc, "resourceLogs", "request")):
        for s, sl in enumerate(_items(rl, "scopeLogs", f"resourceLogs[{r}]")):
            where = f"resourceLogs[{r}].scopeLogs[{s}].logRecords"
            _fix_ids(_items(sl, "logRecords", f"resourceLogs[{r}].scopeLogs[{s}]"), where, _log_id_problem, problems)


def _count_json(doc: dict[str, Any], keys: tuple[str, str, str]) -> int:
    n = 0
    top, mid, leaf = keys
    for r in doc.get(top) or ():
        if isinstance(r, dict):
            for s in r.get(mid) or ():
                if isinstance(s, dict) and isinstance(s.get(leaf), list):
                    n += len(s[leaf])
    return n


def _item_lists(doc: dict[str, Any], keys: tuple[str, str, str]) -> list[list[Any]]:
    top, mid, leaf = keys
    return [s[leaf] for r in doc.get(top) or () if isinstance(r, dict)
            for s in r.get(mid) or () if isinstance(s, dict) and isinstance(s.get(leaf), list)]


_JSON_KEYS = {"traces": ("resourceSpans", "scopeSpans", "spans"), "logs": ("resourceLogs", "scopeLogs", "logRecords")}


def _parse_json(body: bytes, msg: Any, fix: Any, problems: dict[str, int] | None = None,
                max_items: int | None = None) -> Any:
    lenient = False
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as exc:
        # strings that are not UTF-8 fail the whole document: read it leniently, drop just those items
        doc = loads_lenient(body) if problems is not None else None
        if doc is None:
            raise DecodeError(f"invalid JSON: {exc}") from None
        lenient = True
    if not isinstance(doc, dict):
        raise DecodeError("an OTLP JSON request must be an object")
    keys = _JSON_KEYS["traces" if fix is _fix_trace_ids else "logs"]
    if max_items is not None:  # before the protobuf message is built: that is where the memory goes
        n = _count_json(doc, keys)
        if n > max_items:
            raise too_many(n, max_items, "spans" if keys[2] == "spans" else "log records")
    if lenient and problems is not None:
        for items in _item_lists(doc, keys):
            drop_bad_strings(items, problems)
    fix(doc, problems)
    try:
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise DecodeError(f"invalid OTLP JSON: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"invalid OTLP JSON: {exc}") from None
    return msg


def _parse_proto(body: bytes, msg: Any) -> Any:
    try:
        msg.ParseFromString(body)
    except (_ProtoDecodeError, ValueError, RuntimeError) as exc:
        raise DecodeError(f"invalid OTLP protobuf: {exc}") from None
    return msg


def decode_traces(body: bytes, content_type: str, problems: dict[str, int] | None = None,
                  max_items: int | None = None) -> ExportTraceServiceRequest:
    """Decode an (already decompressed) OTLP trace request; raises ``DecodeError``.

    With ``problems``, OTLP JSON spans whose ids are not hex strings are left out and counted there
    by reason (``validate_traces(req, problems)`` reports them as partial success); without it they
    fail the request. ``max_items``: refuse (``TooManyItems``) a JSON request with more spans.
    """
    msg = ExportTraceServiceRequest()
    if media_type(content_type) == JSON:
        return _parse_json(body, msg, _fix_trace_ids, problems, max_items)
    return _parse_proto(body, msg)


def decode_logs(body: bytes, content_type: str, problems: dict[str, int] | None = None,
                max_items: int | None = None) -> ExportLogsServiceRequest:
    """Decode an (already decompressed) OTLP logs request; raises ``DecodeError``. ``problems`` and
    ``max_items``: as for ``decode_traces``, for log records."""
    msg = ExportLogsServiceRequest()
    if media_type(content_type) == JSON:
        return _parse_json(body, msg, _fix_log_ids, problems, max_items)
    return _parse_proto(body, msg)


def count_spans(req: ExportTraceServiceRequest) -> int:
    """Number of spans in a trace request."""
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


def count_logs(req: ExportLogsServiceRequest) -> int:
    """Number of log records in a logs request."""
    return sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs)


def encode_message(msg: Any, media: str) -> bytes:
    """Serialize a response message in the request's encoding (OTLP JSON for JSON)."""
    if media == JSON:
        return json_format.MessageToJson(msg, indent=None).encode()
    return msg.SerializeToString()

