"""The store tables as Arrow: their schemas, the promoted span columns, and ``Tables`` of converted rows.

``SCHEMAS`` follows the DuckDB column contract of ``schema.py``. ``PROMOTED`` lists the span
attributes that also have a column of their own (in ``spans`` column order, after ``service_name``),
with ``codec.typed.as_text`` / ``as_int`` giving a typed value's column value. ``table`` turns row
tuples into a store table; ``concat`` joins the ``Tables`` of several conversions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from otel_agenttape import semconv as sc
from otel_agenttape.store import schema

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

_PLAIN, _FLOAT, _DATE, _JSON = range(4)
_KINDS = {t: _FLOAT if t == pa.float64() else _DATE if t == pa.date32() else
          _JSON if isinstance(t, pa.ExtensionType) else _PLAIN for t in _DUCK_TO_ARROW.values()}


# promoted columns in spans column order (after service_name): (attribute, as int?)
PROMOTED: list[tuple[str, bool]] = [
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
SLOT = {key: (i, as_int) for i, (key, as_int) in enumerate(PROMOTED)}
PROVIDER_SLOT = SLOT[sc.GEN_AI_PROVIDER_NAME][0]
NO_PROMOTED = (None,) * len(PROMOTED)


@dataclass
class Tables:
    """Rows of one conversion, one Arrow table per store table."""

    spans: pa.Table
    span_events: pa.Table
    span_links: pa.Table
    resources: pa.Table
    log_records: pa.Table
    in_batch_duplicates: int = 0  # repeats dropped, conflicts included
    in_batch_conflicts: int = 0  # repeats whose content differs from the first copy (conflicts.py)
    conflict_example: str | None = None

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
    # the chunks of the keys' chunked arrays: given the chunked arrays themselves, pa.chunked_array
    # would convert them value by value through Python scalars
    chunks = [c for k in span_keys for c in k.chunks]
    if n_spans and pc.count_distinct(pa.chunked_array(chunks, type=pa.string())).as_py() < n_spans:
        seen: set[Any] = set()
        fixed = []
        repeats = []
        for p, keys in zip(parts, span_keys):
            keep = pa.array(_first_seen(keys.to_pylist(), seen), type=pa.bool_())
            if pc.all(keep).as_py():
                fixed.append(p)
                continue
            dropped = pc.filter(keys, pc.invert(keep))
            dups += len(dropped)
            repeats.append(p.spans.filter(pc.invert(keep)))

            def others(t: pa.Table, dropped: pa.Array = dropped) -> pa.Table:
                if not t.num_rows:
                    return t
                k = pc.binary_join_element_wise(t.column("trace_id"), t.column("span_id"), "")
                return t.filter(pc.invert(pc.is_in(k, dropped)))

            fixed.append(Tables(p.spans.filter(keep), others(p.span_events), others(p.span_links),
                                p.resources, p.log_records))
        parts = fixed
        from otel_agenttape.store.conflicts import count_differing

        conflicts, example = count_differing(pa.concat_tables([p.spans for p in parts]), pa.concat_tables(repeats))
        conflicts += sum(p.in_batch_conflicts for p in parts)
    else:
        conflicts, example = sum(p.in_batch_conflicts for p in parts), None
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
        in_batch_conflicts=conflicts,
        conflict_example=example,
    )


def table(name: str, rows: list[tuple], columns: Any = None) -> pa.Table:
    """The store table ``name`` of ``rows``; ``columns``: the compiled transposition (``_spanwalk.columns``),
    which steps through the rows in C where ``zip(*rows)`` steps one iterator per row."""
    sch = SCHEMAS[name]
    if not rows:
        return empty(name)
    n = len(rows)
    arrays = []
    cols = columns(rows, len(sch)) if columns is not None else None
    for f, col in zip(sch, cols if cols is not None else zip(*rows)):
        kind = _KINDS[f.type]
        storage = f.type.storage_type if kind == _JSON else pa.int32() if kind == _DATE else f.type
        first = col[0]
        # one value in every row (resource, scope, service, day, most promoted columns of a batch):
        # repeat it in C rather than convert each row. Not for floats, where 0.0 == -0.0.
        if first is not None and kind != _FLOAT and col.count(first) == n:
            arr = pa.repeat(pa.scalar(first, type=storage), n)
        else:
            arr = pa.array(col, type=storage)
        if kind == _DATE:
            arr = arr.view(pa.date32())
        elif kind == _JSON:
            arr = pa.ExtensionArray.from_storage(f.type, arr)
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=sch)


# built once: making an empty table of a wide schema costs tens of microseconds, per request
_EMPTY: dict[str, pa.Table] = {}


def empty(name: str) -> pa.Table:
    t = _EMPTY.get(name)
    if t is None:
        t = _EMPTY[name] = SCHEMAS[name].empty_table()
    return t


