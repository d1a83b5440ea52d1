"""OTLP requests -> Arrow tables shaped exactly like the store tables (``schema.py``).

This is the ingest hot path. Trace requests are read through ``otlp_view`` (attributes stay raw
``KeyValue`` bytes, mapped to typed JSON members through the caches of ``wirecache.py``), each span
becomes one tuple (columns are transposed in C with ``zip``, or ``_spanwalk.columns``), the compiled
walk (``_spanwalk.pyx``) takes spans in protobuf's own layout, and the attribute encoding matches
``codec.typed.attrs_from_proto`` + ``codec.typed.dumps`` byte for byte (tests check it). Log requests are
read as OTLP messages. Spans repeated within one conversion (same trace id + span id) are kept once:
the first wins. The table shapes, ``Tables`` and ``concat`` are in ``tables.py``.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Iterable
from typing import Any

import orjson
import pyarrow as pa
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_agenttape import native
from otel_agenttape.codec import otlp_view
from otel_agenttape.codec.typed import as_text, from_proto
from otel_agenttape.store import span_rules, wirecache
from otel_agenttape.store.tables import (  # SCHEMAS, Tables, arrow_schema, concat: also taken from here
    NO_PROMOTED,
    PROVIDER_SLOT,
    SCHEMAS,
    Tables,
    arrow_schema,
    concat,
    empty,
    table,
)
from otel_agenttape.store.wirecache import (
    CACHES,
    PLAN_CACHE,
    RESOURCE_CACHE,
    attrs_json,
    event_cached,
    event_fields,
    kv_cached,
    kv_entry,
    make_plan,
    parse_event,
    set_cached,
    set_json,
)

_NS_PER_DAY = 86_400 * 1_000_000_000
_SORT = orjson.OPT_SORT_KEYS

def _typed(value: Any) -> dict[str, Any]:
    """One AnyValue -> typed form: the shared encoding, so stored rows hash like live spans."""
    return from_proto(value)


def _typed_attrs(key_values: Iterable[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in key_values:
        v = kv.value
        s = v.string_value  # most values are strings: skip WhichOneof for them
        out[kv.key] = {"s": s} if s else _typed(v)
    return out


def resource_id(schema_url: str, attributes_json: str) -> str:
    """sha256 hex of (schema_url, typed attributes JSON): equal resources share one row."""
    return hashlib.sha256(f"{schema_url}\n{attributes_json}".encode()).hexdigest()


class _Resources:
    def __init__(self) -> None:
        self.rows: dict[str, tuple] = {}

    def add(self, resource: Any, schema_url: str) -> tuple[str, str | None]:
        typed = _typed_attrs(resource.attributes)
        attrs_json = orjson.dumps(typed, option=_SORT).decode()
        rid = resource_id(schema_url, attrs_json)
        if rid not in self.rows:
            self.rows[rid] = (rid, attrs_json, schema_url or None, resource.dropped_attributes_count)
        svc = typed.get("service.name")
        return rid, (as_text(svc) if svc else None)

    def add_wire(self, resource: Any, schema_url: str) -> tuple[str, str | None]:
        """``add`` for an ``otlp_view`` resource (attributes as raw ``KeyValue`` bytes); cached by content."""
        ckey = (tuple(resource.attributes), tuple(resource.entity_refs), resource.dropped_attributes_count, schema_url)
        hit = RESOURCE_CACHE.get(ckey)
        if hit is None:
            real = Resource.FromString(resource.SerializeToString())  # the OTLP message, checked as such
            if len(RESOURCE_CACHE) >= wirecache.CACHE_ENTRIES:
                RESOURCE_CACHE.clear()
            hit = RESOURCE_CACHE[ckey] = self._row(real, schema_url)
        row, service = hit
        if row[0] not in self.rows:
            self.rows[row[0]] = row
        return row[0], service

    @staticmethod
    def _row(resource: Any, schema_url: str) -> tuple[tuple, str | None]:
        typed = _typed_attrs(resource.attributes)
        attrs_json = orjson.dumps(typed, option=_SORT).decode()
        rid = resource_id(schema_url, attrs_json)
        svc = typed.get("service.name")
        return (rid, attrs_json, schema_url or None, resource.dropped_attributes_count), (as_text(svc) if svc else None)

    def table(self) -> pa.Table:
        return table("resources", list(self.rows.values()))


def _source(request: Any) -> Any:
    """Serialized bytes, or an ``otlp_view.TracesRequest`` given as such (an OTLP message is serialized)."""
    if isinstance(request, bytes):
        return request
    if isinstance(request, (bytearray, memoryview)):
        return bytes(request)
    if isinstance(request, otlp_view.TracesRequest):
        return request
    return request.SerializeToString()


def traces_to_tables(requests: Iterable[Any], problems: dict[str, int] | None = None, *,
                     compiled: bool | None = None) -> Tables:
    """Convert trace requests (serialized ``ExportTraceServiceRequest`` bytes, OTLP messages, or
    ``otlp_view`` messages) to spans/span_events/span_links/resources.

    With a ``problems`` dict, spans with invalid ids are left out and counted there by reason
    (``span_problem``); without one every span is converted. Raises
    ``google.protobuf.message.DecodeError`` when a request (or an attribute in it) does not decode.
    ``compiled``: None uses the compiled span walk when it is built, False never, True requires it
    (the rows are the same either way).
    """
    if compiled and _spanwalk is None:
        raise RuntimeError("the compiled span walk (otel_agenttape.store._spanwalk) is not built")
    walk = False if compiled is False else None
    # Millions of short-lived objects would trigger the cyclic GC over and over; none form cycles.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _traces_to_tables([_source(r) for r in requests], problems, walk)
    finally:
        if was_enabled:
            gc.enable()


_ZERO_TRACE = otlp_view.ZERO_TRACE_ID
_ZERO_SPAN = otlp_view.ZERO_SPAN_ID
span_problem = span_rules.span_problem
_KIND_MIN, _KIND_MAX = span_rules.KIND_MIN, span_rules.KIND_MAX


def _decode_only(span: Any) -> None:
    """Decode the attributes of a span that is left out, so a malformed one still fails the request."""
    attrs_json(span.attributes[:])
    for raw in span.events:
        attrs_json(parse_event(raw).attributes[:])
    for ln in span.links:
        attrs_json(ln.attributes[:])


class Conversion:
    """The rows of one conversion so far, and what it has seen (for "first wins" and problems).

    The compiled walk appends to ``span_rows`` and ``event_rows``, reads and adds to ``seen`` and reads
    ``problems`` (None: every span is converted); anything else it hands to ``add_span``."""

    def __init__(self, problems: dict[str, int] | None, columns: Any = None) -> None:
        self.columns = columns  # the compiled transposition, or None for zip
        self.span_rows: list[tuple] = []
        self.event_rows: list[tuple] = []
        self.link_rows: list[tuple] = []
        self.res = _Resources()
        self.seen: set[bytes] = set()
        self.dups = 0
        self.problems = problems

    def tables(self) -> Tables:
        return Tables(
            spans=table("spans", self.span_rows, self.columns),
            span_events=table("span_events", self.event_rows, self.columns),
            span_links=table("span_links", self.link_rows, self.columns),
            resources=self.res.table(),
            log_records=empty("log_records"),
            in_batch_duplicates=self.dups,
        )

    def add_span(self, span: Any, rid: str, scope_name: str | None, scope_version: str | None,
                 service: str | None) -> None:
        """One ``otlp_view`` span: its row, its events' and links' rows (or a problem, or a repeat).
        ``_spanwalk`` does the same for spans in protobuf's own layout; the tests hold them equal."""
        tid_b = span.trace_id
        sid_b = span.span_id
        parent = span.parent_span_id
        links = span.links
        problems = self.problems
        if problems is not None and (
            len(tid_b) != 16 or len(sid_b) != 8 or tid_b == _ZERO_TRACE or sid_b == _ZERO_SPAN
            or (parent and len(parent) != 8)
            or (links and any(len(ln.trace_id) != 16 or len(ln.span_id) != 8 for ln in links))
            or not _KIND_MIN <= span.kind <= _KIND_MAX
        ):
            why = span_problem(span) or "invalid ids"
            problems[why] = problems.get(why, 0) + 1
            _decode_only(span)
            return
        key = tid_b + sid_b
        if key in self.seen:
            self.dups += 1
            _decode_only(span)
            return
        self.seen.add(key)
        tid = tid_b.hex()
        sid = sid_b.hex()
        start = span.start_time_unix_nano
        end = span.end_time_unix_nano
        day = start // _NS_PER_DAY
        # a slice of a repeated field is a list made in C; iterating the field itself
        # goes item by item through the sequence protocol
        raws = span.attributes[:]
        if raws:
            entries = [kv_cached(r) or kv_entry(r) for r in raws]
            keys, pieces, values = zip(*entries)
            plan = PLAN_CACHE.get(keys) or make_plan(keys)
            attributes = "{" + ",".join(plan[0](pieces)) + "}"
            if plan[1] is None:
                promoted = NO_PROMOTED
            else:
                promoted = plan[1](values + (None,))
                if plan[2] is not None and promoted[PROVIDER_SLOT] is None:
                    promoted = list(promoted)
                    promoted[PROVIDER_SLOT] = values[plan[2]]
        else:
            attributes = "{}"
            promoted = NO_PROMOTED
        status = span.status
        self.span_rows.append(
            (
                tid,
                sid,
                parent.hex() if parent else None,
                span.trace_state or None,
                span.flags,
                span.name,
                span.kind,
                start,
                end,
                (end - start) / 1e6,
                status.code,
                status.message or None,
                attributes,
                span.dropped_attributes_count,
                span.dropped_events_count,
                span.dropped_links_count,
                rid,
                scope_name,
                scope_version,
                service,
                *promoted,
                day,
            )
        )
        events = span.events
        if events:
            add_event = self.event_rows.append
            for i, raw in enumerate(events[:]):
                hit = event_cached(raw[9:]) if raw and raw[0] == 0x09 else None
                if hit is not None:
                    add_event((tid, sid, i, int.from_bytes(raw[1:9], "little"), *hit, day))
                else:
                    add_event((tid, sid, i, *event_fields(raw), day))
        if links:
            for i, ln in enumerate(links):
                raws = tuple(ln.attributes[:])
                self.link_rows.append(
                    (
                        tid,
                        sid,
                        i,
                        ln.trace_id.hex(),
                        ln.span_id.hex(),
                        ln.trace_state or None,
                        ln.flags,
                        set_cached(raws) or set_json(raws),
                        ln.dropped_attributes_count,
                        day,
                    )
                )


def _scope(conv: Conversion, rs: Any, ss: Any) -> tuple[str, str | None, str | None, str | None]:
    """(resource id, scope name, scope version, service name) of one ``ScopeSpans``."""
    rid, service = conv.res.add_wire(rs.resource, rs.schema_url)
    scope = ss.scope
    if scope.attributes:
        attrs_json(scope.attributes[:])  # not stored; decoded like the rest
    return rid, scope.name or None, scope.version or None, service


_spanwalk = native.load("otel_agenttape.store._spanwalk")


def _walk_caches(conv: Conversion) -> Any:
    """What ``_spanwalk.walk`` is given: the shared caches and routines (``wirecache.CACHES``), and its fallback:
    ``conv.add_span`` of the span parsed by protobuf."""
    def fallback(raw: bytes, rid: str, scope_name: str | None, scope_version: str | None,
                 service: str | None) -> None:
        conv.add_span(otlp_view.Span.FromString(raw), rid, scope_name, scope_version, service)

    return _spanwalk.Caches(CACHES, fallback)


def _traces_to_tables(requests: list[Any], problems: dict[str, int] | None,
                      walk: Any = None) -> Tables:
    walk = walk if walk is not None else (_spanwalk.walk if _spanwalk is not None else False)
    conv = Conversion(problems, _spanwalk.columns if walk else None)
    add_span = conv.add_span
    caches = None
    for request in requests:
        if walk and isinstance(request, bytes):
            if caches is None:
                caches = _walk_caches(conv)
            for rs in otlp_view.RawTracesRequest.FromString(request).resource_spans:
                for ss in rs.scope_spans:
                    walk(ss.spans[:], conv, _scope(conv, rs, ss), caches)
            continue
        if isinstance(request, bytes):
            request = otlp_view.parse_traces(request)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                rid, scope_name, scope_version, service = _scope(conv, rs, ss)
                for span in ss.spans:
                    add_span(span, rid, scope_name, scope_version, service)
    return conv.tables()


def log_id(resource_id_: str, scope_name: str, scope_version: str, record_bytes: bytes) -> str:
    """sha256 hex over the resource, the scope and the record's deterministic encoding."""
    h = hashlib.sha256()
    h.update(f"{resource_id_}\n{scope_name}\n{scope_version}\n".encode())
    h.update(record_bytes)
    return h.hexdigest()


def request_log_ids(request: Any) -> list[str]:
    """The ``log_id`` of each log record of one ``ExportLogsServiceRequest``, in its order (repeats kept):
    how a request log's records are matched with stored rows."""
    res = _Resources()
    out = []
    for rl in request.resource_logs:
        rid, _ = res.add(rl.resource, rl.schema_url)
        for sl in rl.scope_logs:
            for rec in sl.log_records:
                out.append(log_id(rid, sl.scope.name, sl.scope.version, rec.SerializeToString(deterministic=True)))
    return out


def logs_to_tables(requests: Iterable[Any]) -> Tables:
    """Convert ``ExportLogsServiceRequest`` messages to log_records/resources."""
    rows: list[tuple] = []
    res = _Resources()
    seen: set[str] = set()
    dups = 0
    for request in requests:
        for rl in request.resource_logs:
            rid, service = res.add(rl.resource, rl.schema_url)
            for sl in rl.scope_logs:
                scope_name = sl.scope.name
                scope_version = sl.scope.version
                for rec in sl.log_records:
                    lid = log_id(rid, scope_name, scope_version, rec.SerializeToString(deterministic=True))
                    if lid in seen:
                        dups += 1
                        continue
                    seen.add(lid)
                    t = rec.time_unix_nano or None
                    observed = rec.observed_time_unix_nano or None
                    when = t or observed or 0
                    body = (
                        orjson.dumps(_typed(rec.body), option=_SORT).decode() if rec.HasField("body") else None
                    )
                    rows.append(
                        (
                            lid,
                            t,
                            observed,
                            rec.severity_number,
                            rec.severity_text or None,
                            rec.event_name or None,
                            body,
                            orjson.dumps(_typed_attrs(rec.attributes), option=_SORT).decode(),
                            rec.trace_id.hex() or None,
                            rec.span_id.hex() or None,
                            rec.flags,
                            rec.dropped_attributes_count,
                            rid,
                            scope_name or None,
                            scope_version or None,
                            service,
                            when // _NS_PER_DAY,
                        )
                    )
    return Tables(
        spans=empty("spans"),
        span_events=empty("span_events"),
        span_links=empty("span_links"),
        resources=res.table(),
        log_records=table("log_records", rows),
        in_batch_duplicates=dups,
    )


__all__ = [
    "SCHEMAS",
    "Conversion",
    "Tables",
    "arrow_schema",
    "concat",
    "log_id",
    "logs_to_tables",
    "request_log_ids",
    "resource_id",
    "span_problem",
    "traces_to_tables",
]
