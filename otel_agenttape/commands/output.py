"""How commands print: rows as aligned text, JSON or CSV (``print_table``), and one value shortened to a line (``short``)."""

from __future__ import annotations

import csv
import datetime as dt
import json
from decimal import Decimal
from typing import Any, TextIO

import pyarrow as pa

from otel_agenttape.codec.jsontext import dump_json

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


def short(value: Any, limit: int = 160) -> str:
    """A value as one line of at most ``limit`` characters (JSON for structures, newlines as ``\\n``)."""
    text = value if isinstance(value, str) else dump_json(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"
