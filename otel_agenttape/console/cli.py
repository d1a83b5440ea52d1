"""The ``agenttape console`` command: pick the source, check the bind address, serve until stopped."""

from __future__ import annotations

import argparse
import json
import sys

from otel_agenttape.cli import CliError, _port, default_db

from .serve import DEFAULT_PORT, ConsoleError, check_bind, open_tapes, serve
from .serve import serve as serve_console


def run(args: argparse.Namespace) -> int:
    sources = [bool(args.files), bool(args.lake), bool(args.db)]
    if sum(sources) > 1:
        raise CliError("give one source: --db PATH, --lake DIR or OTLP files")
    port = _port(args.port, "CONSOLE_PORT", DEFAULT_PORT)
    db = args.db or (None if args.files or args.lake else default_db())
    try:
        check_bind(args.host, args.token, args.insecure_no_auth)
        tapes = open_tapes(db=db, lake=args.lake, files=args.files or None)
    except ConsoleError as exc:
        raise CliError(str(exc)) from None
    from otel_agenttape.commands.sources import with_prices

    tapes = with_prices(tapes, getattr(args, "prices", None))
    source = getattr(tapes, "description", "") or db or args.lake or " ".join(args.files)

    def ready(url: str) -> None:
        if args.json:
            print(json.dumps({"url": url, "source": source, "token_required": bool(args.token)}), flush=True)
        else:
            print(f"agenttape console: {url}  reading {source}" + ("  (token required)" if args.token else ""),
                  flush=True)

    try:
        serve(tapes, host=args.host, port=port, token=args.token, insecure_no_auth=args.insecure_no_auth,
              on_ready=ready)
    except ConsoleError as exc:
        raise CliError(str(exc)) from None
    finally:
        tapes.close()
    print("agenttape console: stopped", file=sys.stderr)
    return 0


def demo_console(db: str, serve: bool = False, port: int | None = None) -> None:
    """End of ``agenttape demo``: the console's URL, and with ``serve`` the console itself until Ctrl-C."""
    port = _port(port, "CONSOLE_PORT", DEFAULT_PORT)  # as `agenttape console`: --console-port, else the env
    if not serve:
        print()
        print(f"See it in the browser: agenttape console --db {db}   # then open http://127.0.0.1:{port}/")
        print("(or run the demo with --serve)")
        return
    try:
        tapes = open_tapes(db=db)
    except ConsoleError as exc:
        raise CliError(str(exc)) from None

    def ready(url: str) -> None:
        print()
        print(f"Console: {url}   (serving {db}; Ctrl-C to stop)", flush=True)

    try:
        serve_console(tapes, host="127.0.0.1", port=port, on_ready=ready)
    except ConsoleError as exc:
        raise CliError(str(exc)) from None
    finally:
        tapes.close()
