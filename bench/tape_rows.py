"""Sealed span rows as the store keeps them, written straight into a DuckDB store: the tapes that
``bench/integrity.py`` and ``bench/erasure.py`` verify and erase (one builder for both).

``span_rows`` seals ``n`` tool spans into one chain (leaf v1, or v2 with the two content values salted
as capture salts them); ``insert_rows`` appends them to the ``spans`` table with their date.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from otel_agenttape import semconv
from otel_agenttape.codec.typed import attrs_from_python
from otel_agenttape.integrity import Chain
from otel_agenttape.integrity.leaf_fast import salts_text
from otel_agenttape.store import rows as store_rows
from otel_agenttape.tape.sealed_rows import row_leaf

TOOL_ATTRS: dict[str, Any] = {
    semconv.GEN_AI_OPERATION_NAME: "execute_tool", semconv.GEN_AI_TOOL_NAME: "search",
    semconv.GEN_AI_TOOL_CALL_ARGUMENTS: '{"q":"weather in Paris for the next three days, hourly"}',
    semconv.GEN_AI_TOOL_CALL_RESULT: '{"t":21.5,"sky":"clear","wind_kmh":12,"humidity":0.41,"source":"met"}',
    semconv.NODE_TYPE: "tool", "ratio": 0.25,
}
_SALTED = (semconv.GEN_AI_TOOL_CALL_ARGUMENTS, semconv.GEN_AI_TOOL_CALL_RESULT)


def span_rows(n: int, trace_id: str, run_id: str, v2: bool, session: str | None = None, start_index: int = 0,
              chain: Chain | None = None, base: Mapping[str, Any] = TOOL_ATTRS) -> tuple[list[dict], Chain]:
    """Sealed rows of one tape (``chain``: go on with it), salted for v2."""
    chain = chain or Chain(run_id)
    out = []
    for i in range(start_index, start_index + n):
        attrs = {**base, semconv.RUN_ID: run_id, semconv.STEP: i, semconv.GEN_AI_TOOL_CALL_ID: f"call_{i}"}
        if session:
            attrs[semconv.SESSION_ID] = session
        typed = attrs_from_python(attrs)
        if v2:
            typed[semconv.CHAIN_SALTS] = {"s": salts_text({k: os.urandom(16) for k in _SALTED if k in typed})}
        row = {
            "trace_id": trace_id, "span_id": f"{i + 1:016x}", "parent_span_id": "0000000000000001",
            "trace_state": None, "flags": 256, "name": "execute_tool search", "kind": 1,
            "start_time_unix_nano": 1_764_450_000_000_000_000 + i * 1000,
            "end_time_unix_nano": 1_764_450_000_000_000_000 + i * 1000 + 500,
            "status_code": 0, "status_message": None, "attributes": typed,
            "dropped_attributes_count": 0, "dropped_events_count": 0, "dropped_links_count": 0,
        }
        link = chain.append(row_leaf(row))
        typed.update(attrs_from_python({
            semconv.CHAIN_ID: link.chain_id, semconv.CHAIN_SEQ: link.seq, semconv.CHAIN_PREV: link.prev,
            semconv.CHAIN_HASH: link.hash, semconv.CHAIN_EPOCH: 0,
        }))
        row.update(
            attributes=orjson.dumps(dict(sorted(typed.items()))).decode(), duration_ms=0.0005,
            chain_id=link.chain_id, chain_seq=link.seq, chain_prev=link.prev, chain_hash=link.hash,
            chain_epoch=0, run_id=run_id, step=i, node_type="tool", tool_name="search",
            operation_name="execute_tool", session_id=session,
        )
        out.append(row)
    return out, chain


def insert_rows(con: duckdb.DuckDBPyConnection, rows: list[dict]) -> None:
    """Append rows to ``spans`` (the date computed from the start time, as the store does)."""
    cols = [c for c in store_rows.SCHEMAS["spans"].names if c != "date"]
    tbl = pa.table({c: [r.get(c) for r in rows] for c in cols})
    con.register("batch_tbl", tbl)
    con.execute(f"INSERT INTO spans SELECT {', '.join(cols)}, "
                f"CAST(make_timestamp(start_time_unix_nano // 1000) AS DATE) FROM batch_tbl")
    con.unregister("batch_tbl")
