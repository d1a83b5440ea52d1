"""``agenttape sql``: one read-only query against a store, a lake or a server (``Tapes.sql``)."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from otel_agenttape.commands.errors import reported
from otel_agenttape.commands.output import print_table
from otel_agenttape.commands.sources import store_errors


def sql(db: str, query: str, fmt: str = "text", out: TextIO | None = None, timeout: float | None = 30.0,
        prices: str | None = None) -> int:
    """Run one read-only query and print its rows; it is interrupted after ``timeout`` seconds.
    ``prices``: the overrides ``call_costs`` is priced with."""
    from otel_agenttape.commands.sources import with_prices
    from otel_agenttape.sources import open as open_tapes

    out = out or sys.stdout
    with with_prices(open_tapes(db), prices) as tapes:
        table = tapes.sql(query, timeout=timeout)
    print_table(table, out, fmt)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run one read-only SQL query against the store."""
    fmt = "json" if args.json else "csv" if args.csv else "text"
    with reported(*store_errors()):
        return sql(args.lake or args.db, args.query, fmt=fmt, timeout=args.timeout, prices=args.prices)
