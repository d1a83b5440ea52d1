"""``agenttape dataset``: completed runs as OpenAI chat fine-tuning JSONL (``Tapes.dataset``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from otel_agenttape.commands.errors import EXIT_OK, CliError
from otel_agenttape.commands.sources import read


def run(args: argparse.Namespace) -> int:
    """Export completed runs as OpenAI chat fine-tuning JSONL; skipped runs are counted by reason."""
    from otel_agenttape.tape.read.filters import parse_since

    try:
        since = parse_since(args.since) if args.since else None
    except ValueError:
        raise CliError(f"--since: not an ISO date/time or nanoseconds since the epoch: {args.since}") from None

    from otel_agenttape.tape.read.scores import label_filters, score_filters

    try:
        score, label = score_filters(args.score), label_filters(args.label)
    except ValueError as exc:
        raise CliError(str(exc)) from None

    def export(tapes: Any) -> Any:
        try:
            out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc}") from None
        try:
            return tapes.dataset(out, agent=args.agent, model=args.model, since=since, score=score, label=label)
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc}") from None
        finally:
            if out is not sys.stdout:
                out.close()

    result = read(args, export)
    print(result.summary(), file=sys.stderr if args.out == "-" else sys.stdout)
    if args.json:
        print(json.dumps({"written": result.written, "skipped": dict(result.skipped)}),
              file=sys.stderr if args.out == "-" else sys.stdout)
    return EXIT_OK
