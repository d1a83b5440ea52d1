"""OTLP requests -> Arrow tables shaped exactly like the store tables (``schema.py``).

This is the ingest hot path. Each span becomes one tuple (columns are transposed in C with ``zip``),
attribute sets are encoded to typed JSON with one ``orjson.dumps`` per set, and the encoding matches
``anyvalue.attrs_from_proto`` + ``anyvalue.dumps`` byte for byte (tests check it).
Spans repeated within one conversion (same trace id + span id) are kept once: the first wins.
"""

from __future__ import annotations

import gc
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from otel_agenttape import anyvalue
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


def _typed(value: Any) -> dict[str, Any]:
    """One AnyValue -> typed form: the shared encoding, so stored rows hash like live spans."""
    return anyvalue.from_proto(value)


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


def _first_seen(keys: list[Any], seen: set[Any]) -> list[bool]:
    keep = []
    for k in keys:
        keep.append(k not in seen)
        seen.add(k)
    return keep


def concat(parts: list[Tables]) -> Tables:
    """One ``Tables`` from several conversions (written in one transaction); a span, log record or
    resource repeated across parts is kept once (the first), like repeats within one conversion."""
    if len(parts) == 1:
        return parts[0]
    import pyarrow.compute as pc

    dups = sum(p.in_batch_duplicates for p in parts)
    span_keys = [pc.binary_join_element_wise(p.spans.column("trace_id"), p.spans.column("span_id"), "")
                 for p in parts]
    n_spans = sum(len(k) for k in span_keys)
    if n_spans and pc.count_distinct(pa.chunked_array(span_keys, type=pa.string())).as_py() < n_spans:
        seen: set[Any] = set()
        fixed = []
        for p, keys in zip(parts, span_keys):
            keep = pa.array(_first_seen(keys.to_pylist(), seen), type=pa.bool_())
            if pc.all(keep).as_py():
                fixed.append(p)
                continue
            dropped = pc.filter(keys, pc.invert(keep))
            dups += len(dropped)

            def others(t: pa.Table, dropped: pa.Array = dropped) -> pa.Table:
                if not t.num_rows:
                    return t
                k = pc.binary_join_element_wise(t.column("trace_id"), t.column("span_id"), "")
                return t.filter(pc.invert(pc.is_in(k, dropped)))

            fixed.append(Tables(p.spans.filter(keep), others(p.span_events), others(p.span_links),
                                p.resources, p.log_records))
        parts = fixed
    logs = pa.concat_tables([p.log_records for p in parts])
    if logs.num_rows and pc.count_distinct(logs.column("log_id")).as_py() < logs.num_rows:
        keep = pa.array(_first_seen(logs.column("log_id").to_pylist(), set()), type=pa.bool_())
        dups += logs.num_rows - pc.sum(keep.cast(pa.int64())).as_py()
        logs = logs.filter(keep)
    res = pa.concat_tables([p.resources for p in parts])
    if res.num_rows > 1:
        res = res.filter(pa.array(_first_seen(res.column("resource_id").to_pylist(), set()), type=pa.bool_()))
    return Tables(
        spans=pa.concat_tables([p.spans for p in parts]),
        span_events=pa.concat_tables([p.span_events for p in parts]),
        span_links=pa.concat_tables([p.span_links for p in parts]),
        resources=res,
        log_records=logs,
        in_batch_duplicates=dups,
    )


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


# promoted columns in spans column order (after service_name): (attribute, as int?)
_PROMOTED: list[tuple[str, bool]] = [
    (sc.GEN_AI_OPERATION_NAME, False),
    (sc.GEN_AI_AGENT_NAME, False),
    (sc.RUN_ID, False),
    (sc.SESSION_ID, False),
    (sc.PARENT_RUN_ID, False),
    (sc.RUN_STATUS, False),
    (sc.TURN_ID, False),
    (sc.STEP, True),
    (sc.NODE_TYPE, False),
    (sc.GEN_AI_PROVIDER_NAME, False),  # or gen_ai.system, below
    (sc.GEN_AI_REQUEST_MODEL, False),
    (sc.GEN_AI_RESPONSE_MODEL, False),
    (sc.GEN_AI_TOOL_NAME, False),
    (sc.GEN_AI_TOOL_CALL_ID, False),
    (sc.GEN_AI_USAGE_INPUT_TOKENS, True),
    (sc.GEN_AI_USAGE_OUTPUT_TOKENS, True),
    (sc.CHAIN_ID, False),
    (sc.CHAIN_SEQ, True),
    (sc.CHAIN_PREV, False),
    (sc.CHAIN_HASH, False),
    (sc.CHAIN_EPOCH, True),
]
_SLOT = {key: (i, as_int) for i, (key, as_int) in enumerate(_PROMOTED)}
_PROVIDER_SLOT = _SLOT[sc.GEN_AI_PROVIDER_NAME][0]
_NO_PROMOTED = (None,) * len(_PROMOTED)


def _promoted(a: dict[str, Any]) -> tuple:
    """The promoted column values of one typed attribute set, in column order."""
    hits = a.keys() & _SLOT.keys()
    has_system = sc.GEN_AI_SYSTEM in a
    if not hits and not has_system:
        return _NO_PROMOTED
    out = list(_NO_PROMOTED)
    for key in hits:
        i, as_int = _SLOT[key]
        out[i] = _int(a[key]) if as_int else _text(a[key])
    if has_system and out[_PROVIDER_SLOT] is None:
        out[_PROVIDER_SLOT] = _text(a[sc.GEN_AI_SYSTEM])
    return tuple(out)


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
    promoted = _promoted
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
                    status = span.status
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
                            *promoted(a),
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
