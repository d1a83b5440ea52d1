"""The ``agenttape`` command.

Each subcommand is a ``cmd_<name>(args) -> int`` function registered in ``_build_parser``.
Exit codes: 0 success, 1 the command ran and found a problem (for example a tape that does
not verify), 2 usage or input error (bad arguments, unreadable file, bad query).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """An error shown to the user as one line, exiting with ``EXIT_USAGE``."""


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"AGENTTAPE_{name}", default)


def default_db() -> str:
    return _env("DB", "./agenttape.duckdb") or "./agenttape.duckdb"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agenttape",
        description="Record, store, verify and replay AI agent runs as OpenTelemetry data.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # Subcommands register themselves below (one block each).
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"agenttape: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
