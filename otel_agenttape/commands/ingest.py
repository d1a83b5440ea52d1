"""``agenttape ingest``: OTLP files into the store, or into the server holding it (``receiver.files.ingest_files``)."""

from __future__ import annotations

import argparse
import json

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK, CliError


def run(args: argparse.Namespace) -> int:
    """Load OTLP files (JSON, JSON lines, protobuf, .gz) into the store, or into the server holding it."""
    from otel_agenttape.receiver.files import ingest_files

    try:
        summary = ingest_files(args.files, args.db, signal=args.signal)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(summary))
    else:
        dup = summary["duplicates"]
        print(
            f"ingested {summary['spans']} spans and {summary['logs']} log records from {summary['files']} file(s)"
            f" into {summary['target']}; {summary['rejected']} rejected"
            + (f" ({summary['message']})" if summary["message"] else "")
            + (f"; {dup} already stored (duplicates)" if dup is not None
               else "; duplicates are counted by the server (/metrics)")
        )
    return EXIT_FAILED if summary["rejected"] else EXIT_OK
