"""``agenttape serve``: the OTLP receiver (``receiver.server.TapeServer``) in the foreground until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import os
from typing import Any

from otel_agenttape.commands.errors import EXIT_OK, CliError


def port(value: int | None, env: str, default: int) -> int:
    """``--*-port`` if given, else ``AGENTTAPE_<env>``, else ``default``; read only by ``serve`` so a bad
    variable cannot break the other commands."""
    source = f"--{env.lower().replace('_', '-')}"
    if value is None:
        raw = os.environ.get(f"AGENTTAPE_{env}", "").strip()
        if not raw:
            return default
        source = f"AGENTTAPE_{env}={raw!r}"
        try:
            value = int(raw)
        except ValueError:
            raise CliError(f"{source} is not a port number") from None
    if not 0 <= value <= 65535:
        raise CliError(f"{source}: a port is between 0 and 65535")
    return value


def _limits(args: argparse.Namespace) -> Any:
    """The receiver's ``Limits`` from ``serve``'s flags (see docs/operations.md)."""
    from otel_agenttape.receiver.limits import Limits

    try:
        return Limits(max_body=args.max_body, max_spans_per_request=args.max_spans_per_request,
                      max_connections=args.max_connections, header_timeout=args.header_timeout,
                      body_timeout=args.body_timeout, idle_timeout=args.idle_timeout)
    except ValueError as exc:
        raise CliError(f"serve: {exc}") from None


def _memory(value: str | None) -> Any:
    from otel_agenttape.receiver.memory import MemoryBudget

    try:
        return MemoryBudget.of(value)
    except ValueError as exc:
        raise CliError(f"--memory-limit: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Run the OTLP receiver in the foreground until SIGINT/SIGTERM."""
    import signal

    from otel_agenttape.receiver.server import TapeServer, read_discovery

    http_port = port(args.http_port, "HTTP_PORT", 4318)
    grpc_port = port(args.grpc_port, "GRPC_PORT", 4317)
    holder = read_discovery(args.db)
    if holder is not None and holder.get("pid") != os.getpid():
        raise CliError(f"{args.db} is already served by pid {holder['pid']} at {holder.get('url')}")
    console = None
    if not args.no_console:
        from otel_agenttape.console.serve import ConsoleError, annotations_for, check_bind, receiver_app

        try:
            check_bind(args.host, args.token, args.insecure_no_auth)
            # annotations go through this receiver's own OTLP port: its write-ahead log, like any span
            annotations = annotations_for(args.annotate_token, args.token, lambda: server.url, args.token)
        except ConsoleError as exc:
            raise CliError(f"{exc} (or --no-console)") from None
        console = receiver_app(lambda: server.store, args.token, annotations)
    server = TapeServer(
        args.db,
        host=args.host,
        http_fallback=console,
        http_port=http_port,
        grpc_port=grpc_port,
        parquet_dir=args.parquet_dir,
        token=args.token,
        ingest_workers=args.ingest_workers,
        query_timeout=args.query_timeout,
        memory_limit=_memory(args.memory_limit),
        warm_workers=True,
        release_after=args.release_after,
        lake=args.lake,
        receiver_id=args.receiver_id,
        lake_interval=args.lake_interval,
        lake_max_spans=args.lake_max_spans,
        limits=_limits(args),
        span_metrics=not args.no_span_metrics and os.environ.get("AGENTTAPE_SPAN_METRICS", "1") != "0",
        metrics_otlp_endpoint=args.metrics_otlp_endpoint or None,
        metrics_otlp_interval=args.metrics_otlp_interval,
    )
    try:
        server.start()
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot start the receiver: {exc}") from None
    signal.signal(signal.SIGTERM, lambda *_: server.request_stop())
    signal.signal(signal.SIGINT, lambda *_: server.request_stop())
    msg = (
        f"agenttape serve: OTLP/HTTP {server.url}  OTLP/gRPC {args.host}:{server.grpc_port}  db {args.db}"
        + (f"  parquet {args.parquet_dir}" if args.parquet_dir else "")
        + (f"  lake {args.lake} as {server.publisher.receiver}" if server.publisher is not None else "")
        + (f"  (replayed {server.replayed_records} WAL records)" if server.replayed_records else "")
        + (f"  console {server.url}/" if console is not None else "")
    )
    if args.json:
        import json

        msg = json.dumps({"url": server.url, "http_port": server.http_port, "grpc_port": server.grpc_port,
                          "db": args.db, "pid": os.getpid(), "replayed": server.replayed_records,
                          "lake": args.lake, "receiver_id": server.publisher.receiver if server.publisher else None})
    print(msg, flush=True)
    try:
        server.serve_forever()
    finally:
        server.stop()
    return EXIT_OK
