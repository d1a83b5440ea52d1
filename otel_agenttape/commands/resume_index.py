"""``agenttape resume-index``: a run's resume index rebuilt from the store, a lake or OTLP files
(``Tapes.write_resume_index``)."""

from __future__ import annotations

import argparse

import orjson

from otel_agenttape.commands.errors import EXIT_OK, CliError
from otel_agenttape.commands.sources import open_tapes


def run(args: argparse.Namespace) -> int:
    """Write the run's index as JSON for ``ResumeIndex.load_json``; an unknown run or one without model or tool
    nodes is a one-line error."""
    from otel_agenttape.tape.refs import RunNotFound

    tapes = open_tapes(args)
    try:
        index = tapes.write_resume_index(args.run, args.out)
    except (RunNotFound, ValueError) as exc:  # as show, replay and diff say it
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot write {args.out}: {exc}") from None
    finally:
        tapes.close()
    counts = {k: len(index.entries(k)) for k in ("model", "tool")}
    if getattr(args, "json", False):
        print(orjson.dumps({"run": args.run, "out": str(args.out), **counts}).decode())
    else:
        print(f"resume index for run {args.run}: {counts['model']} model and {counts['tool']} tool entries -> {args.out}")
    return EXIT_OK
