"""``agenttape export parquet``: the store as a Parquet lake (``store.parquet.export_parquet``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from otel_agenttape.commands.errors import reported
from otel_agenttape.commands.sources import store_errors


def export(db: str, directory: str, overwrite: bool = False, as_json: bool = False,
           out: TextIO | None = None) -> int:
    """Write every table to a Parquet lake."""
    from otel_agenttape.store.parquet import export_parquet
    from otel_agenttape.store.reader import open_reader

    out = out or sys.stdout
    with open_reader(db) as reader:
        counts = export_parquet(reader, directory, overwrite=overwrite)
    if as_json:
        out.write(json.dumps({"dir": directory, "rows": counts}) + "\n")
    else:
        out.write(f"exported to {directory}: " + ", ".join(f"{n} {t}" for t, n in counts.items()) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    """Export the store to a Parquet lake (Hive-partitioned by date, zstd)."""
    with reported(*store_errors()):
        return export(args.db, args.dir, overwrite=args.overwrite, as_json=args.json)
