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


def _cell(v: Any, whole: bool = False) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        text = f"{v:.3f}".rstrip("0").rstrip(".")
    else:
        text = str(_jsonable(v))
    text = text.replace("\n", " ")
    return text if whole or len(text) <= _CELL else text[: _CELL - 1] + "…"


def print_table(table: pa.Table, out: TextIO, fmt: str = "text", whole: tuple[str, ...] = ()) -> None:
    """Print rows as aligned text, JSON (one array) or CSV; ``whole`` columns are never shortened."""
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
    cells = [[_cell(r[c], c in whole) for c in table.column_names] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(table.column_names)]
    line = "  ".join(c.ljust(widths[i]) for i, c in enumerate(table.column_names))
    out.write(line.rstrip() + "\n")
    for row in cells:
        out.write("  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip() + "\n")
    out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


_RUN_COLUMNS = ("ref", "agent", "source", "status", "session_id", "parent_ref", "errors", "start_time",
                "duration_ms", "model_calls", "tool_calls", "input_tokens", "output_tokens")


def _iso(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc).replace(tzinfo=None).isoformat()


def runs(db: Any, limit: int = 20, as_json: bool = False, out: TextIO | None = None, **filters: Any) -> int:
    """List runs of every source newest first, with a footer saying how many more match."""
    from otel_agenttape.sources import open as open_tapes

    out = out or sys.stdout
    with open_tapes(db) as tapes:
        page = tapes.runs(limit=int(limit), **{k: v for k, v in filters.items() if v is not None})
    if as_json:
        out.write(json.dumps([r.to_dict() for r in page.runs], ensure_ascii=False, default=str) + "\n")
        return 0
    rows = [{**r.to_dict(), "start_time": _iso(r.start_ns)} for r in page.runs]
    table = pa.Table.from_pylist([{c: row[c] for c in _RUN_COLUMNS} for row in rows]) if rows else pa.table(
        {c: pa.array([], pa.string()) for c in _RUN_COLUMNS})
    print_table(table, out, "text", whole=("ref", "parent_ref"))
    more = page.total - len(page.runs)
    if more > 0:
        out.write(f"{more} more (of {page.total}): raise --limit or narrow with --agent/--status/--source/"
                  "--session/--since\n")
    return 0


def sql(db: str, query: str, fmt: str = "text", out: TextIO | None = None) -> int:
    """Run one read-only query and print its rows."""
    from otel_agenttape.sources import open as open_tapes

    out = out or sys.stdout
    with open_tapes(db) as tapes:
        table = tapes.sql(query)
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
