"""``agenttape resume-index``: a run's resume index rebuilt from the store, a lake or OTLP files."""

from __future__ import annotations

import argparse

import orjson

from otel_agenttape.cli import CliError
from otel_agenttape.commands.sources import open_tapes
from otel_agenttape.tape.refs import split_ref


def cmd_resume_index(args: argparse.Namespace) -> int:
    tapes = open_tapes(args)
    run_id, _ = split_ref(args.run)
    try:
        index = tapes.resume_index(args.run)
        known = len(index) > 0 or tapes.sql(
            "SELECT 1 AS x FROM spans WHERE run_id = ? OR trace_id = ? LIMIT 1", [run_id, run_id]).num_rows > 0
    finally:
        tapes.close()
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
