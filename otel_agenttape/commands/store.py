"""The store's CLI commands: ``agenttape runs``, ``agenttape sql`` and ``agenttape export parquet``.

Each returns an exit code (0 ok, 2 usage/input error) and raises ``StoreError``/``QueryError`` with a
message for the user; ``cli.py`` turns those into one-line errors.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import sys
from decimal import Decimal
from typing import Any, TextIO

import pyarrow as pa

from otel_agenttape.store.reader import open_reader
from otel_agenttape.store.sql import run_readonly_sql

_CELL = 60


def _jsonable(v: Any) -> Any:
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, bytes):
        import base64

        return base64.b64encode(v).decode("ascii")
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return v


def _pylist(table: pa.Table) -> list[dict[str, Any]]:
    # nanosecond timestamps do not fit datetime: show them as ISO text from the integer value
    cols = []
    for name, col in zip(table.column_names, table.columns):
        if pa.types.is_timestamp(col.type) and col.type.unit == "ns":
            col = col.cast(pa.timestamp("us", tz=col.type.tz), safe=False)
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names).to_pylist()


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        text = f"{v:.3f}".rstrip("0").rstrip(".")
    else:
        text = str(_jsonable(v))
    text = text.replace("\n", " ")
    return text if len(text) <= _CELL else text[: _CELL - 1] + "…"


def print_table(table: pa.Table, out: TextIO, fmt: str = "text") -> None:
    """Print rows as aligned text, JSON (one array) or CSV."""
    rows = _pylist(table)
    if fmt == "json":
        out.write(json.dumps([_jsonable(r) for r in rows], ensure_ascii=False, default=str) + "\n")
        return
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(table.column_names)
        for r in rows:
            w.writerow(["" if r[c] is None else _jsonable(r[c]) for c in table.column_names])
        return
    cells = [[_cell(r[c]) for c in table.column_names] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(table.column_names)]
    line = "  ".join(c.ljust(widths[i]) for i, c in enumerate(table.column_names))
    out.write(line.rstrip() + "\n")
    for row in cells:
        out.write("  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip() + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


# The runs view (one row per run span) plus the runs known only by their node spans: their process
# died before the run span ended, so they are listed as ``incomplete``, as ``replay`` calls them.
RUNS_SQL = """
WITH listed AS (
  SELECT run_id, trace_id, agent, session_id, status, start_time, duration_ms,
         model_nodes, tool_nodes, input_tokens, output_tokens, start_time_unix_nano
  FROM runs
  UNION ALL
  SELECT s.run_id, s.trace_id, any_value(s.agent_name), any_value(s.session_id), 'incomplete',
         make_timestamp(min(s.start_time_unix_nano) // 1000),
         (max(s.end_time_unix_nano) - min(s.start_time_unix_nano)) / 1e6,
         count(*) FILTER (WHERE s.node_type = 'model'), count(*) FILTER (WHERE s.node_type = 'tool'),
         CAST(sum(s.input_tokens) AS BIGINT), CAST(sum(s.output_tokens) AS BIGINT), min(s.start_time_unix_nano)
  FROM spans s
  WHERE s.node_type IN ('model', 'tool') AND s.run_id IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM spans r WHERE r.operation_name = 'invoke_agent' AND r.run_id = s.run_id AND r.trace_id = s.trace_id)
  GROUP BY s.run_id, s.trace_id
)
SELECT run_id, trace_id, agent, session_id, status, start_time, duration_ms,
       model_nodes, tool_nodes, input_tokens, output_tokens
FROM listed ORDER BY start_time_unix_nano DESC, run_id LIMIT ?
"""


def runs(db: str, limit: int = 20, as_json: bool = False, out: TextIO | None = None) -> int:
    """List runs newest first."""
    out = out or sys.stdout
    with open_reader(db) as reader:
        table = reader.query(RUNS_SQL, [int(limit)])
    print_table(table, out, "json" if as_json else "text")
    return 0


def sql(db: str, query: str, fmt: str = "text", out: TextIO | None = None, timeout: float | None = 30.0) -> int:
    """Run one read-only query and print its rows; it is interrupted after ``timeout`` seconds."""
    out = out or sys.stdout
    with open_reader(db) as reader:
        table = run_readonly_sql(reader, query, timeout=timeout)
    print_table(table, out, fmt)
    return 0


def export(db: str, directory: str, overwrite: bool = False, as_json: bool = False,
           out: TextIO | None = None) -> int:
    """Write every table to a Parquet lake."""
    from otel_agenttape.store.parquet import export_parquet

    out = out or sys.stdout
    with open_reader(db) as reader:
        counts = export_parquet(reader, directory, overwrite=overwrite)
    if as_json:
        out.write(json.dumps({"dir": directory, "rows": counts}) + "\n")
    else:
        buf = io.StringIO()
        buf.write(f"exported to {directory}: ")
        buf.write(", ".join(f"{n} {t}" for t, n in counts.items()))
        out.write(buf.getvalue() + "\n")
    return 0
