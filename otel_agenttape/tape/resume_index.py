"""Rebuild a resume index from the tape store (a DuckDB file, a Parquet lake or OTLP files).

A run recorded on one machine can then be resumed on another from its exported traces: node spans
recorded through a resumable client carry their resume key (``agenttape.resume.key``); other node
spans still give entries (tools keyed by name + arguments, model calls matched by position).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

from ..codec.typed import attrs_to_python
from ..resume import ResumeIndex
from ..resume.spans import entry_from_span
from ..semconv import EVENT_TEXT, MODEL_OPERATIONS, OP_EXECUTE_TOOL

_OPS = ", ".join(f"'{op}'" for op in sorted({*MODEL_OPERATIONS, OP_EXECUTE_TOOL}))
_NODES = f"run_id = ? AND (node_type IN ('model', 'tool') OR operation_name IN ({_OPS}))"


def _rows(table: Any) -> list[dict[str, Any]]:
    cols = table.column_names
    data = [table.column(c).to_pylist() for c in cols]
    return [dict(zip(cols, vals)) for vals in zip(*data)]


def build_resume_index(reader: Any, run_id: str, *, tape: str | None = None, trace_id: str | None = None,
                       **kwargs: Any) -> ResumeIndex:
    """The resume index of one run, from ``reader.query(sql, params) -> pyarrow.Table``.

    Every trace of the run id counts (a resumed run goes on in a new trace) unless ``trace_id`` picks one.
    ``tape`` defaults to the run id; ``kwargs`` go to ``ResumeIndex`` (``journal=`` to continue
    into a local journal, ``replay_only=``).
    """
    nodes, params = _NODES, [run_id]
    if trace_id is not None:
        nodes, params = f"{_NODES} AND trace_id = ?", [run_id, trace_id]
    spans = _rows(reader.query(
        "SELECT trace_id, span_id, status_code, CAST(attributes AS VARCHAR) AS attributes, "
        f"start_time_unix_nano FROM spans WHERE {nodes} ORDER BY start_time_unix_nano, span_id",
        params))
    events: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    if spans:
        ev_rows = _rows(reader.query(
            "SELECT e.trace_id, e.span_id, e.name, CAST(e.attributes AS VARCHAR) AS attributes "
            "FROM span_events e SEMI JOIN (SELECT trace_id, span_id FROM spans "
            f"WHERE {nodes}) s ON e.trace_id = s.trace_id AND e.span_id = s.span_id "
            "WHERE e.name = ? ORDER BY e.trace_id, e.span_id, e.event_index", [*params, EVENT_TEXT]))
        for ev in ev_rows:
            events[(ev["trace_id"], ev["span_id"])].append((ev["name"], attrs_to_python(ev["attributes"])))
    index = ResumeIndex(tape or run_id, **kwargs)
    positions: dict[str, int] = defaultdict(int)
    occurrences: dict[tuple[str, str], int] = defaultdict(int)
    for row in spans:
        attrs = attrs_to_python(row["attributes"])
        kind_probe = entry_from_span(attrs, tape=index.tape)
        if kind_probe is None:
            continue
        kind = kind_probe.kind
        occ_key = (kind, kind_probe.request_hash)
        entry = entry_from_span(
            attrs, events.get((row["trace_id"], row["span_id"]), ()), tape=index.tape,
            position=positions[kind], occurrence=occurrences[occ_key], failed=row["status_code"] == 2,
        )
        positions[kind] += 1
        occurrences[occ_key] += 1
        if entry is not None and index.get(entry.key) is None:
            index.add(entry)
    return index


def write_resume_index(reader: Any, run_id: str, out: str | os.PathLike[str], *,
                       trace_id: str | None = None) -> ResumeIndex:
    """Save a run's rebuilt index as the JSON file ``ResumeIndex.load_json`` reads, and return it; a run with
    no model or tool node raises ``ValueError`` and writes nothing."""
    index = build_resume_index(reader, run_id, trace_id=trace_id)
    if len(index) == 0:
        ref = run_id if trace_id is None else f"{run_id}@{trace_id}"
        raise ValueError(f"no model or tool nodes recorded for run {ref}")
    index.save_json(out)
    return index
