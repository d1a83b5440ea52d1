"""A wire-compatible view of ``ExportTraceServiceRequest`` that leaves every attribute as raw bytes.

Reading a parsed OTLP span from Python costs one call per field of every ``KeyValue`` and
``AnyValue``, and most attributes repeat from span to span (operation, model, provider, run and
session ids, small numbers). These messages declare the same field numbers and types as the OTLP
protos, except that each repeated ``KeyValue`` field is ``repeated bytes``: one parse gives the spans
with their attributes as byte strings, which the store's ``rows.py`` maps to their typed JSON through a cache
and parses with the real ``KeyValue`` only on a miss. A span's events are ``repeated bytes`` too
(each one an ``Event``, which ``rows.py`` parses only when its cache misses: events of one kind
repeat all but their time). Everything else decodes exactly as with the OTLP classes (UTF-8 checks
on strings, merging of repeated singular messages), and a message of these types serializes to
bytes that the OTLP classes read back.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "agenttape.otlpwire"
_FD = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "bytes": _FD.TYPE_BYTES,
    "string": _FD.TYPE_STRING,
    "fixed64": _FD.TYPE_FIXED64,
    "fixed32": _FD.TYPE_FIXED32,
    "int32": _FD.TYPE_INT32,  # OTLP enums (open in proto3) read the same as int32
    "uint32": _FD.TYPE_UINT32,
}

# message -> (field name, number, type); "*" marks a repeated field. Numbers and types follow
# opentelemetry/proto/{trace,resource,common}/v1/*.proto, with KeyValue (and EntityRef) as bytes.
_MESSAGES: dict[str, list[tuple[str, int, str]]] = {
    "Status": [("message", 2, "string"), ("code", 3, "int32")],
    "Event": [("time_unix_nano", 1, "fixed64"), ("name", 2, "string"), ("attributes", 3, "*bytes"),
              ("dropped_attributes_count", 4, "uint32")],
    # an Event without its time (field 1): what follows the time in an event as protobuf writes it
    "EventTail": [("name", 2, "string"), ("attributes", 3, "*bytes"), ("dropped_attributes_count", 4, "uint32")],
    "Link": [("trace_id", 1, "bytes"), ("span_id", 2, "bytes"), ("trace_state", 3, "string"),
             ("attributes", 4, "*bytes"), ("dropped_attributes_count", 5, "uint32"), ("flags", 6, "fixed32")],
    "Span": [("trace_id", 1, "bytes"), ("span_id", 2, "bytes"), ("trace_state", 3, "string"),
             ("parent_span_id", 4, "bytes"), ("flags", 16, "fixed32"), ("name", 5, "string"), ("kind", 6, "int32"),
             ("start_time_unix_nano", 7, "fixed64"), ("end_time_unix_nano", 8, "fixed64"),
             ("attributes", 9, "*bytes"), ("dropped_attributes_count", 10, "uint32"), ("events", 11, "*bytes"),
             ("dropped_events_count", 12, "uint32"), ("links", 13, "*Link"), ("dropped_links_count", 14, "uint32"),
             ("status", 15, "Status")],
    "Scope": [("name", 1, "string"), ("version", 2, "string"), ("attributes", 3, "*bytes"),
              ("dropped_attributes_count", 4, "uint32")],
    "Resource": [("attributes", 1, "*bytes"), ("dropped_attributes_count", 2, "uint32"),
                 ("entity_refs", 3, "*bytes")],
    "ScopeSpans": [("scope", 1, "Scope"), ("spans", 2, "*Span"), ("schema_url", 3, "string")],
    "ResourceSpans": [("resource", 1, "Resource"), ("scope_spans", 2, "*ScopeSpans"), ("schema_url", 3, "string")],
    "TracesRequest": [("resource_spans", 1, "*ResourceSpans")],
    # the same request with each span left as bytes, for the compiled span walk (store/_spanwalk.pyx)
    "RawScopeSpans": [("scope", 1, "Scope"), ("spans", 2, "*bytes"), ("schema_url", 3, "string")],
    "RawResourceSpans": [("resource", 1, "Resource"), ("scope_spans", 2, "*RawScopeSpans"),
                         ("schema_url", 3, "string")],
    "RawTracesRequest": [("resource_spans", 1, "*RawResourceSpans")],
}


def _build() -> dict[str, Any]:
    fp = descriptor_pb2.FileDescriptorProto(name="agenttape/otlpwire.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        msg = fp.message_type.add(name=name)
        for fname, number, ftype in fields:
            repeated = ftype.startswith("*")
            ftype = ftype.lstrip("*")
            f = msg.field.add(name=fname, number=number, label=_FD.LABEL_REPEATED if repeated else _FD.LABEL_OPTIONAL)
            if ftype in _SCALARS:
                f.type = _SCALARS[ftype]
            else:
                f.type = _FD.TYPE_MESSAGE
                f.type_name = f".{_PACKAGE}.{ftype}"
    pool = descriptor_pool.DescriptorPool()  # private: never clashes with the OTLP classes
    pool.Add(fp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in _MESSAGES}


_CLASSES = _build()
TracesRequest: Any = _CLASSES["TracesRequest"]
Event: Any = _CLASSES["Event"]
EventTail: Any = _CLASSES["EventTail"]
Span: Any = _CLASSES["Span"]
RawTracesRequest: Any = _CLASSES["RawTracesRequest"]


def parse_traces(payload: bytes) -> Any:
    """Parse a serialized ``ExportTraceServiceRequest``; raises ``google.protobuf.message.DecodeError``."""
    return TracesRequest.FromString(payload)


# ids OTLP reserves for "no id"
ZERO_TRACE_ID = bytes(16)
ZERO_SPAN_ID = bytes(8)
