"""OTLP trace requests written straight to protobuf wire bytes.

The SDK's encoder builds one protobuf object per attribute, value, span and event before it
serializes: for a 2.7 KB GenAI span that is about two thirds of all the CPU a span costs. This
module writes the same ``ExportTraceServiceRequest`` bytes directly, field by field in field-number
order (the order ``SerializeToString`` uses), and caches the encoding of attributes that repeat
from span to span (``gen_ai.operation.name``, model names, run ids, resource and scope). It follows
the SDK encoder's choices exactly (grouping by resource and scope, span flags, status always present,
an attribute that cannot be encoded is skipped and logged), and the tests compare both encoders'
output on the same spans.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanKind

from otel_agenttape import native

_logger = logging.getLogger(__name__)

_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4,
         SpanKind.CONSUMER: 5}
_FLAGS_HAS_IS_REMOTE = 0x100
_FLAGS_IS_REMOTE = 0x200
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_SMALL = [bytes([i]) for i in range(128)]

# Encoded string attributes that repeat (ids, names): per key, up to _CACHE_PER_KEY distinct values;
# a key whose values keep changing (hashes, record ids) stops being cached after that.
_CACHE_MAX_VALUE = 160
_CACHE_PER_KEY = 32
_CACHE_MAX_KEYS = 1024
_str_cache: dict[str, dict[str, bytes]] = {}
# Per key: the KeyValue's key field followed by the value's tag.
_key_heads: dict[str, bytes] = {}


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    if n < 16384:
        return bytes((n & 0x7F | 0x80, n >> 7))
    if n < 2097152:
        return bytes((n & 0x7F | 0x80, (n >> 7) & 0x7F | 0x80, n >> 14))
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """One length-delimited field: tag, length, payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + payload


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` message body, with the SDK encoder's type order (bool before int)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8"))
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"int {value} is out of the int64 range")
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join([_field(b"\x0a", _any_value(v)) for v in value]))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join([_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items()]))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message body."""
    return _key_head(key)[:-1] + _field(b"\x12", _any_value(value))


def _key_head(key: str) -> bytes:
    head = _key_heads.get(key)
    if head is None:
        head = (_field(b"\x0a", key.encode("utf-8")) if key else b"") + b"\x12"
        if len(_key_heads) >= _CACHE_MAX_KEYS:
            _key_heads.clear()
        _key_heads[key] = head
    return head


def _attributes(attributes: Mapping[str, Any] | None, tag: bytes) -> list[bytes]:
    """Each attribute as a complete repeated ``KeyValue`` field under ``tag``, as a list of pieces
    (a long string value is its own piece, so it is copied once, by the final join)."""
    if not attributes:
        return []
    out: list[bytes] = []
    small = _SMALL
    for key, value in attributes.items():
        cls = value.__class__
        if cls is str:
            short = len(value) <= _CACHE_MAX_VALUE
            if short:
                per_key = _str_cache.get(key)
                if per_key is not None:
                    encoded = per_key.get(value)
                    if encoded is not None:
                        out.append(tag + encoded)
                        continue
            try:
                data = value.encode("utf-8")
            except UnicodeEncodeError as error:  # the SDK encoder skips such an attribute the same way
                _logger.exception("Failed to encode key %s: %s", key, error)
                continue
            n = len(data)
            av_len = n + (2 if n < 128 else 1 + len(_varint(n)))
            head = _key_head(key)
            kv_len = len(head) + (1 if av_len < 128 else len(_varint(av_len))) + av_len
            prefix = (head + (small[av_len] if av_len < 128 else _varint(av_len)) + b"\x0a"
                      + (small[n] if n < 128 else _varint(n)))
            length = small[kv_len] if kv_len < 128 else _varint(kv_len)
            if short:
                encoded = length + prefix + data
                per_key = _str_cache.get(key)
                if per_key is None:
                    if len(_str_cache) >= _CACHE_MAX_KEYS:
                        _str_cache.clear()
                    per_key = _str_cache[key] = {}
                if len(per_key) < _CACHE_PER_KEY:
                    per_key[value] = encoded
                out.append(tag + encoded)
            else:
                out.append(tag + length + prefix)
                out.append(data)
            continue
        try:
            if cls is int and _INT64_MIN <= value <= _INT64_MAX:
                av = b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
            else:
                av = _any_value(value)
            n = len(av)
            body = _key_head(key) + (small[n] if n < 128 else _varint(n)) + av
        except Exception as error:  # the SDK encoder skips such an attribute the same way
            _logger.exception("Failed to encode key %s: %s", key, error)
            continue
        n = len(body)
        out.append(tag + (small[n] if n < 128 else _varint(n)) + body)
    return out


def _flags(parent: Any) -> bytes:
    flags = _FLAGS_HAS_IS_REMOTE
    if parent is not None and parent.is_remote:
        flags |= _FLAGS_IS_REMOTE
    return b"\x85\x01" + _pack_fixed32(flags)


def _status(status: Any) -> bytes:
    if status is None:
        return b""
    body = b""
    if status.description:
        body = _field(b"\x12", status.description.encode("utf-8"))
    code = status.status_code.value
    if code:
        body += b"\x18" + _varint(code)
    return _field(b"\x7a", body)


def _event(event: Any) -> bytes:
    parts = []
    if event.timestamp:
        parts.append(b"\x09" + _pack_fixed64(event.timestamp))
    if event.name:
        parts.append(_field(b"\x12", event.name.encode("utf-8")))
    parts.extend(_attributes(event.attributes, b"\x1a"))
    if event.dropped_attributes:
        parts.append(b"\x20" + _varint(event.dropped_attributes))
    return _field(b"\x5a", b"".join(parts))


def _link(link: Any) -> bytes:
    ctx = link.context
    parts = [b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big"), b"\x12\x08" + ctx.span_id.to_bytes(8, "big")]
    parts.extend(_attributes(link.attributes, b"\x22"))
    if link.dropped_attributes:
        parts.append(b"\x28" + _varint(link.dropped_attributes))
    flags = _FLAGS_HAS_IS_REMOTE | (_FLAGS_IS_REMOTE if ctx.is_remote else 0)
    parts.append(b"\x35" + _pack_fixed32(flags))
    return _field(b"\x6a", b"".join(parts))


def encode_span(span: Any) -> bytes:
    """One ``Span`` message body from an SDK ``ReadableSpan``."""
    ctx = span.get_span_context()
    parts = [b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big"), b"\x12\x08" + ctx.span_id.to_bytes(8, "big")]
    trace_state = ctx.trace_state
    if trace_state:
        parts.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in trace_state.items()).encode("utf-8")))
    parent = span.parent
    if parent:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    if span.name:
        parts.append(_field(b"\x2a", span.name.encode("utf-8")))
    parts.append(b"\x30" + _SMALL[_KIND[span.kind]])
    if span.start_time:
        parts.append(b"\x39" + _pack_fixed64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _pack_fixed64(span.end_time))
    parts.extend(_attributes(span.attributes, b"\x4a"))
    if span.dropped_attributes:
        parts.append(b"\x50" + _varint(span.dropped_attributes))
    for event in span.events:
        parts.append(_event(event))
    if span.dropped_events:
        parts.append(b"\x60" + _varint(span.dropped_events))
    for link in span.links:
        parts.append(_link(link))
    if span.dropped_links:
        parts.append(b"\x70" + _varint(span.dropped_links))
    parts.append(_status(span.status))
    parts.append(_flags(parent))
    return b"".join(parts)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b"\x0a\x00"
    parts = []
    if scope.name:
        parts.append(_field(b"\x0a", scope.name.encode("utf-8")))
    if scope.version:
        parts.append(_field(b"\x12", scope.version.encode("utf-8")))
    parts.extend(_attributes(scope.attributes, b"\x1a"))
    return _field(b"\x0a", b"".join(parts))


def _resource(resource: Any) -> bytes:
    return _field(b"\x0a", b"".join(_attributes(resource.attributes, b"\x0a")))


def _group(items: Sequence[Any], key: Any) -> list[tuple[Any, list[Any]]]:
    """Group by an object that is usually shared: by identity first, then by equality (as the SDK
    encoder's dict does), keeping first-seen order."""
    by_id: dict[int, tuple[Any, list[Any]]] = {}
    for item in items:
        obj = key(item)
        entry = by_id.get(id(obj))
        if entry is None:
            entry = by_id[id(obj)] = (obj, [])
        entry[1].append(item)
    groups: list[tuple[Any, list[Any]]] = []
    for obj, members in by_id.values():
        for existing in groups:
            if existing[0] is obj or (existing[0] is not None and obj is not None and existing[0] == obj):
                existing[1].extend(members)
                break
        else:
            groups.append((obj, members))
    return groups


def encode_trace_request(spans: Sequence[Any]) -> bytes:
    """A serialized ``ExportTraceServiceRequest`` holding ``spans``, grouped by resource and scope.

    The pieces are collected in one list, each message's length worked out from its pieces' lengths,
    and joined once: a span's bytes are copied once into the request (nesting by concatenation copied
    a request of 512 spans three times over)."""
    out: list[bytes] = []
    for resource, resource_spans in _group(spans, lambda s: s.resource):
        body = [_resource(resource)]
        for scope, scope_spans in _group(resource_spans, lambda s: s.instrumentation_scope or None):
            scope_body = [_scope(scope)]
            for s in scope_spans:
                encoded = _encode_span(s)
                scope_body += (b"\x12", _varint(len(encoded)), encoded)
            schema_url = scope.schema_url if scope is not None else None
            if schema_url:
                scope_body.append(_field(b"\x1a", schema_url.encode("utf-8")))
            body += (b"\x12", _varint(sum(map(len, scope_body))))
            body += scope_body
        if resource.schema_url:
            body.append(_field(b"\x1a", resource.schema_url.encode("utf-8")))
        out += (b"\x0a", _varint(sum(map(len, body))))
        out += body
    return b"".join(out)


# The compiled twin of ``encode_span`` (``_otlp_encode.pyx``: the same bytes, about ten times faster),
# where it is built; ``encode_span`` above stays the reference, and what the twin leaves to it (values
# of other kinds, links) it hands to ``_attributes`` and ``_link`` here.
native_module = native.load("otel_agenttape.codec._otlp_encode")
if native_module is not None:
    native_module.configure(_KIND, _attributes, _link)
_encode_span = native_module.encode_span if native_module is not None else encode_span
