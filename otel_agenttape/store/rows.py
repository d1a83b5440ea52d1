"""OTLP requests -> Arrow tables shaped exactly like the store tables (``schema.py``).

This is the ingest hot path. Each span becomes one tuple (columns are transposed in C with ``zip``),
attribute sets are encoded to typed JSON with one ``orjson.dumps`` per set, and the encoding matches
``anyvalue.attrs_from_proto`` + ``anyvalue.dumps`` byte for byte (tests check it).
Spans repeated within one conversion (same trace id + span id) are kept once: the first wins.
"""

from __future__ import annotations

import base64
import gc
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from otel_agenttape import semconv as sc
from otel_agenttape.store import schema

_NS_PER_DAY = 86_400 * 1_000_000_000
_SORT = orjson.OPT_SORT_KEYS

_DUCK_TO_ARROW = {
    "VARCHAR": pa.string(),
    # arrow.json: DuckDB takes it as JSON without re-validating text orjson produced
    "JSON": pa.json_(pa.string()),
    "UINTEGER": pa.uint32(),
    "TINYINT": pa.int8(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "DATE": pa.date32(),
}


def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of a store table, derived from the DuckDB column contract."""
    fields = []
    for name, ddl in schema.TABLES[table]:
        base = ddl.split()[0]
        fields.append(pa.field(name, _DUCK_TO_ARROW[base], nullable="NOT NULL" not in ddl))
    return pa.schema(fields)


SCHEMAS: dict[str, pa.Schema] = {name: arrow_schema(name) for name in schema.TABLES}


def _double(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(v)


def _typed(value: Any) -> dict[str, Any]:
    """One AnyValue -> typed form (same rules as ``anyvalue.from_proto``)."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return {"s": value.string_value}
    if which == "int_value":
        return {"i": str(value.int_value)}
    if which == "double_value":
        return {"d": _double(value.double_value)}
    if which == "bool_value":
        return {"bool": value.bool_value}
    if which == "bytes_value":
        return {"b": base64.b64encode(value.bytes_value).decode("ascii")}
    if which == "array_value":
        return {"a": [_typed(v) for v in value.array_value.values]}
    if which == "kvlist_value":
        return {"kv": _typed_attrs(value.kvlist_value.values)}
    return {}


def _typed_attrs(key_values: Iterable[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in key_values:
        v = kv.value
        s = v.string_value  # most values are strings: skip WhichOneof for them
        out[kv.key] = {"s": s} if s else _typed(v)
    return out


def _text(t: dict[str, Any] | None) -> str | None:
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
    return orjson.dumps(t, option=_SORT).decode()


def _int(t: dict[str, Any] | None) -> int | None:
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
        return int(v) if math.isfinite(v) and v == int(v) else None
    s = t.get("s")
    if s is not None and s.lstrip("-").isdigit():
        try:
            return int(s)
        except ValueError:
            return None
    return None


def resource_id(schema_url: str, attributes_json: str) -> str:
    """sha256 hex of (schema_url, typed attributes JSON): equal resources share one row."""
    return hashlib.sha256(f"{schema_url}\n{attributes_json}".encode()).hexdigest()


@dataclass
class Tables:
    """Rows of one conversion, one Arrow table per store table."""

    spans: pa.Table
    span_events: pa.Table
    span_links: pa.Table
    resources: pa.Table
    log_records: pa.Table
    in_batch_duplicates: int = 0

    def as_dict(self) -> dict[str, pa.Table]:
        return {
            "spans": self.spans,
            "span_events": self.span_events,
            "span_links": self.span_links,
            "log_records": self.log_records,
            "resources": self.resources,
        }


def _table(name: str, rows: list[tuple]) -> pa.Table:
    sch = SCHEMAS[name]
    if not rows:
        return sch.empty_table()
    cols = list(zip(*rows))
    arrays = []
    for f, col in zip(sch, cols):
        if f.type == pa.date32():
            arrays.append(pa.array(col, type=pa.int32()).view(pa.date32()))
        elif isinstance(f.type, pa.ExtensionType):
            arrays.append(pa.ExtensionArray.from_storage(f.type, pa.array(col, type=f.type.storage_type)))
        else:
            arrays.append(pa.array(col, type=f.type))
    return pa.Table.from_arrays(arrays, schema=sch)


def _empty(name: str) -> pa.Table:
    return SCHEMAS[name].empty_table()


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
        return rid, (_text(svc) if svc else None)

    def table(self) -> pa.Table:
        return _table("resources", list(self.rows.values()))


_P_OPERATION = sc.GEN_AI_OPERATION_NAME
_MISSING: dict[str, Any] = {}


def traces_to_tables(requests: Iterable[Any]) -> Tables:
    """Convert ``ExportTraceServiceRequest`` messages to spans/span_events/span_links/resources."""
    # Millions of short-lived dicts would trigger the cyclic GC over and over; none form cycles.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _traces_to_tables(requests)
    finally:
        if was_enabled:
            gc.enable()


def _traces_to_tables(requests: Iterable[Any]) -> Tables:
    span_rows: list[tuple] = []
    event_rows: list[tuple] = []
    link_rows: list[tuple] = []
    res = _Resources()
    seen: set[bytes] = set()
    dups = 0
    dumps = orjson.dumps
    typed_attrs = _typed_attrs
    text = _text
    as_int = _int
    for request in requests:
        for rs in request.resource_spans:
            rid, service = res.add(rs.resource, rs.schema_url)
            for ss in rs.scope_spans:
                scope = ss.scope
                scope_name = scope.name or None
                scope_version = scope.version or None
                for span in ss.spans:
                    tid_b = span.trace_id
                    sid_b = span.span_id
                    key = tid_b + sid_b
                    if key in seen:
                        dups += 1
                        continue
                    seen.add(key)
                    tid = tid_b.hex()
                    sid = sid_b.hex()
                    start = span.start_time_unix_nano
                    end = span.end_time_unix_nano
                    day = start // _NS_PER_DAY
                    a = typed_attrs(span.attributes)
                    g = a.get
                    status = span.status
                    provider = g(sc.GEN_AI_PROVIDER_NAME) or g(sc.GEN_AI_SYSTEM)
                    parent = span.parent_span_id
                    span_rows.append(
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
                            dumps(a, option=_SORT).decode(),
                            span.dropped_attributes_count,
                            span.dropped_events_count,
                            span.dropped_links_count,
                            rid,
                            scope_name,
                            scope_version,
                            service,
                            text(g(_P_OPERATION)),
                            text(g(sc.GEN_AI_AGENT_NAME)),
                            text(g(sc.RUN_ID)),
                            text(g(sc.SESSION_ID)),
                            text(g(sc.PARENT_RUN_ID)),
                            text(g(sc.RUN_STATUS)),
                            text(g(sc.TURN_ID)),
                            as_int(g(sc.STEP)),
                            text(g(sc.NODE_TYPE)),
                            text(provider),
                            text(g(sc.GEN_AI_REQUEST_MODEL)),
                            text(g(sc.GEN_AI_RESPONSE_MODEL)),
                            text(g(sc.GEN_AI_TOOL_NAME)),
                            text(g(sc.GEN_AI_TOOL_CALL_ID)),
                            as_int(g(sc.GEN_AI_USAGE_INPUT_TOKENS)),
                            as_int(g(sc.GEN_AI_USAGE_OUTPUT_TOKENS)),
                            text(g(sc.CHAIN_ID)),
                            as_int(g(sc.CHAIN_SEQ)),
                            text(g(sc.CHAIN_PREV)),
                            text(g(sc.CHAIN_HASH)),
                            as_int(g(sc.CHAIN_EPOCH)),
                            day,
                        )
                    )
                    if span.events:
                        for i, ev in enumerate(span.events):
                            event_rows.append(
                                (
                                    tid,
                                    sid,
                                    i,
                                    ev.time_unix_nano,
                                    ev.name,
                                    dumps(typed_attrs(ev.attributes), option=_SORT).decode(),
                                    ev.dropped_attributes_count,
                                    day,
                                )
                            )
                    if span.links:
                        for i, ln in enumerate(span.links):
                            link_rows.append(
                                (
                                    tid,
                                    sid,
                                    i,
                                    ln.trace_id.hex(),
                                    ln.span_id.hex(),
                                    ln.trace_state or None,
                                    ln.flags,
                                    dumps(typed_attrs(ln.attributes), option=_SORT).decode(),
                                    ln.dropped_attributes_count,
                                    day,
                                )
                            )
    return Tables(
        spans=_table("spans", span_rows),
        span_events=_table("span_events", event_rows),
        span_links=_table("span_links", link_rows),
        resources=res.table(),
        log_records=_empty("log_records"),
        in_batch_duplicates=dups,
    )


def log_id(resource_id_: str, scope_name: str, scope_version: str, record_bytes: bytes) -> str:
    """sha256 hex over the resource, the scope and the record's deterministic encoding."""
    h = hashlib.sha256()
    h.update(f"{resource_id_}\n{scope_name}\n{scope_version}\n".encode())
    h.update(record_bytes)
    return h.hexdigest()


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
        spans=_empty("spans"),
        span_events=_empty("span_events"),
        span_links=_empty("span_links"),
        resources=res.table(),
        log_records=_table("log_records", rows),
        in_batch_duplicates=dups,
    )
