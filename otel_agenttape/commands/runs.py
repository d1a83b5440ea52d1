"""``agenttape runs``: runs of every source, newest first (``Tapes.runs``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any, TextIO

from otel_agenttape.commands.errors import reported
from otel_agenttape.commands.output import print_table
from otel_agenttape.commands.sources import source_of, store_errors

_RUN_COLUMNS = ("ref", "agent", "source", "status", "session_id", "parent_ref", "errors", "start_time",
                "duration_ms", "model_calls", "tool_calls", "input_tokens", "output_tokens", "cost")


def _iso(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc).replace(tzinfo=None).isoformat()


def cost_text(usd: float | None, unpriced: int) -> str:
    """A run's cost for a table cell: ``$0.0123``, ``$0.0123 +2?`` (2 calls without a price), ``unknown``."""
    from otel_agenttape.pricing import format_usd

    if usd is None:
        return "unknown" if unpriced else "$0"
    return format_usd(usd) + (f" +{unpriced}?" if unpriced else "")


def runs(db: Any, limit: int = 20, as_json: bool = False, out: TextIO | None = None, prices: str | None = None,
         **filters: Any) -> int:
    """List runs of every source newest first, with a footer saying how many more match and how many
    model calls have no price."""
    import pyarrow as pa

    from otel_agenttape.commands.sources import with_prices
    from otel_agenttape.sources import open as open_tapes
    from otel_agenttape.tape.read import Page

    out = out or sys.stdout
    experiment = filters.pop("experiment", None)
    with with_prices(open_tapes(db), prices) as tapes:
        if experiment is not None:
            listed = tapes.experiment_runs(experiment)
            page = Page(listed[: int(limit)], len(listed), None)
            marks = {r.ref: experiment for r in listed}
        else:
            page = tapes.runs(limit=int(limit), **{k: v for k, v in filters.items() if v is not None})
            marks = tapes.experiment_of([r.ref for r in page.runs])
    if as_json:
        out.write(json.dumps([{**r.to_dict(), **({"experiment": marks[r.ref]} if r.ref in marks else {})}
                              for r in page.runs], ensure_ascii=False, default=str) + "\n")
        return 0
    columns = _RUN_COLUMNS + (("experiment",) if marks else ())
    rows = [{**r.to_dict(), "start_time": _iso(r.start_ns), "cost": cost_text(r.cost_usd, r.unpriced_calls),
             "experiment": marks.get(r.ref)} for r in page.runs]
    table = pa.Table.from_pylist([{c: row[c] for c in columns} for row in rows]) if rows else pa.table(
        {c: pa.array([], pa.string()) for c in columns})
    print_table(table, out, "text", whole=("ref", "parent_ref"))
    more = page.total - len(page.runs)
    if more > 0:
        out.write(f"{more} more (of {page.total}): raise --limit or narrow with --agent/--status/--source/"
                  "--session/--since\n")
    unpriced = sum(r.unpriced_calls for r in page.runs)
    if unpriced:
        out.write(f"{unpriced} model call{'s' if unpriced != 1 else ''} without a price (their cost is unknown, "
                  "not 0; --prices FILE gives models a price)\n")
    return 0


def run(args: argparse.Namespace) -> int:
    """List recorded runs, newest first."""
    with reported(*store_errors()):
        return runs(source_of(args), limit=args.limit, as_json=args.json, agent=args.agent, status=args.status,
                    source=args.source, session=args.session, since=args.since,
                    experiment=getattr(args, "experiment", None), prices=args.prices)
