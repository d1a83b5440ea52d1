"""``agenttape console``: the read-only web console over a store, a lake or OTLP files (``console.cli.run``)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Serve the web console over a store, a lake or OTLP files (read-only), until SIGINT/SIGTERM."""
    from otel_agenttape.console.cli import run as serve_console

    return serve_console(args)
