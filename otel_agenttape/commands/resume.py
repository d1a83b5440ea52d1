"""``agenttape resume-index``: a run's resume index rebuilt from the store, a lake or OTLP files."""

from __future__ import annotations

import argparse

import orjson

from otel_agenttape.cli import CliError
from otel_agenttape.commands.sources import open_args
from otel_agenttape.tape.resume_index import build_resume_index


def cmd_resume_index(args: argparse.Namespace) -> int:
    reader = open_args(args)
    try:
        index = build_resume_index(reader, args.run)
        known = len(index) > 0 or reader.query(
            "SELECT 1 AS x FROM spans WHERE run_id = ? OR trace_id = ? LIMIT 1", [args.run, args.run]).num_rows > 0
    finally:
        reader.close()
    if not known:
        raise CliError(f"run not found: {args.run}")  # as show, replay and diff say it
    if len(index) == 0:
        raise CliError(f"no model or tool nodes recorded for run {args.run}")
    try:
        index.save_json(args.out)
    except OSError as exc:
        raise CliError(f"cannot write {args.out}: {exc}") from None
    counts = {k: len(index.entries(k)) for k in ("model", "tool")}
    if getattr(args, "json", False):
        print(orjson.dumps({"run": args.run, "out": str(args.out), **counts}).decode())
    else:
        print(f"resume index for run {args.run}: {counts['model']} model and {counts['tool']} tool entries -> {args.out}")
    return 0
