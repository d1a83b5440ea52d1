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


def _port(value: int | None, env: str, default: int) -> int:
    """``--*-port`` if given, else ``AGENTTAPE_<env>``, else ``default``; read only by ``serve`` so a bad
    variable cannot break the other commands."""
    source = f"--{env.lower().replace('_', '-')}"
    if value is None:
        raw = (_env(env) or "").strip()
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


def _serve_limits(args: argparse.Namespace) -> object:
    """The receiver's ``Limits`` from ``serve``'s flags (see docs/operations.md)."""
    from otel_agenttape.receiver.limits import Limits

    try:
        return Limits(max_body=args.max_body, max_spans_per_request=args.max_spans_per_request,
                      max_connections=args.max_connections, header_timeout=args.header_timeout,
                      body_timeout=args.body_timeout, idle_timeout=args.idle_timeout)
    except ValueError as exc:
        raise CliError(f"serve: {exc}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the OTLP receiver in the foreground until SIGINT/SIGTERM."""
    import signal

    from otel_agenttape.receiver.server import TapeServer, read_discovery

    http_port = _port(args.http_port, "HTTP_PORT", 4318)
    grpc_port = _port(args.grpc_port, "GRPC_PORT", 4317)
    holder = read_discovery(args.db)
    if holder is not None and holder.get("pid") != os.getpid():
        raise CliError(f"{args.db} is already served by pid {holder['pid']} at {holder.get('url')}")
    console = None
    if not args.no_console:
        from otel_agenttape.console.serve import ConsoleError, check_bind, receiver_app

        try:
            check_bind(args.host, args.token, args.insecure_no_auth)
        except ConsoleError as exc:
            raise CliError(f"{exc} (or --no-console)") from None
        console = receiver_app(lambda: server.store, args.token)
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
        warm_workers=True,
        lake=args.lake,
        receiver_id=args.receiver_id,
        lake_interval=args.lake_interval,
        lake_max_spans=args.lake_max_spans,
        limits=_serve_limits(args),
        span_metrics=not args.no_span_metrics and _env("SPAN_METRICS", "1") != "0",
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


def cmd_ingest(args: argparse.Namespace) -> int:
    """Load OTLP files (JSON, JSON lines, protobuf, .gz) into the store, or into the server holding it."""
    import json

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


def cmd_show(args: argparse.Namespace) -> int:
    """Print a recorded run's ordered step stream."""
    from otel_agenttape.commands.tape import cmd_show as run

    return run(args)


def cmd_replay(args: argparse.Namespace) -> int:
    """Rebuild a run (``--tree``: with its child runs) from the store, with no model call."""
    from otel_agenttape.commands.tape import cmd_replay as run

    return run(args)


def cmd_diff(args: argparse.Namespace) -> int:
    """Show the first node where two runs diverge."""
    from otel_agenttape.commands.tape import cmd_diff as run

    return run(args)


def cmd_dataset(args: argparse.Namespace) -> int:
    """Export completed runs as OpenAI chat fine-tuning JSONL."""
    from otel_agenttape.commands.tape import cmd_dataset as run

    return run(args)


def _store_call(fn: object, *a: object, **kw: object) -> int:
    from otel_agenttape.store.reader import StoreError

    try:
        return int(fn(*a, **kw))  # type: ignore[operator]
    except BrokenPipeError:
        raise  # the reader of our output went away: main() exits 0
    except (StoreError, FileExistsError, OSError, ValueError) as exc:
        raise CliError(str(exc)) from None


def cmd_runs(args: argparse.Namespace) -> int:
    """List recorded runs, newest first."""
    from otel_agenttape.commands import store as commands
    from otel_agenttape.commands.sources import source_of

    return _store_call(commands.runs, source_of(args), limit=args.limit, as_json=args.json, agent=args.agent,
                       status=args.status, source=args.source, session=args.session, since=args.since)


def cmd_sql(args: argparse.Namespace) -> int:
    """Run one read-only SQL query against the store."""
    from otel_agenttape.commands import store as commands

    fmt = "json" if args.json else "csv" if args.csv else "text"
    return _store_call(commands.sql, args.lake or args.db, args.query, fmt=fmt, timeout=args.timeout)


def cmd_export(args: argparse.Namespace) -> int:
    """Export the store to a Parquet lake (Hive-partitioned by date, zstd)."""
    from otel_agenttape.commands import store as commands

    return _store_call(commands.export, args.db, args.dir, overwrite=args.overwrite, as_json=args.json)


def _tape_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=default_db(), help="DuckDB tape store (env AGENTTAPE_DB)")
    p.add_argument("--parquet", metavar="DIR", default=None, help="read a Parquet lake instead of --db")
    p.add_argument("--otlp", metavar="FILE", nargs="+", default=None,
                   help="read OTLP files (JSON, JSON lines, protobuf, .gz) instead of --db")
    _lake_read_arg(p)


def _lake_read_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lake", action="append", metavar="LAKE", default=None,
                   help="read a lake (folder or s3://bucket/prefix) instead of --db; repeat it to read several "
                        "lakes and DuckDB files as one store")


def _lake_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lake", default=_env("LAKE"), metavar="DIR|s3://BUCKET/PREFIX",
                   help="also publish immutable Parquet files and a manifest into this lake (env AGENTTAPE_LAKE)")
    p.add_argument("--receiver-id", default=_env("RECEIVER_ID"), metavar="ID",
                   help="this receiver's name in the lake (env AGENTTAPE_RECEIVER_ID, default the host name)")
    p.add_argument("--lake-interval", type=float, default=None, metavar="SECONDS",
                   help="publish at least this often while rows arrive (default 60)")
    p.add_argument("--lake-max-spans", type=int, default=None, metavar="N",
                   help="publish as soon as N spans wait, and at most N spans per batch (default 200000)")


def cmd_lake(args: argparse.Namespace) -> int:
    """Maintain a lake: compact small files, drop old partitions, show what the manifest lists."""
    from otel_agenttape.commands import lake as commands

    return int({"compact": commands.cmd_compact, "retain": commands.cmd_retain,
                "status": commands.cmd_status}[args.lake_command](args))


def cmd_resume_index(args: argparse.Namespace) -> int:
    """Rebuild a run's resume index from the store (or OTLP files) into a JSON file."""
    from otel_agenttape.commands.resume import cmd_resume_index as run

    return run(args)


def cmd_keygen(args: argparse.Namespace) -> int:
    """Create an Ed25519 checkpoint signing key (PREFIX.key) and its public key (PREFIX.pub)."""
    from otel_agenttape.commands.integrity import cmd_keygen as run

    return run(args)


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify every sealed tape (chains, gaps, Merkle roots, signed checkpoints); exit 1 on a failure."""
    from otel_agenttape.commands.integrity import cmd_verify as run

    return run(args)


def cmd_prove(args: argparse.Namespace) -> int:
    """Write a self-contained proof (leaf, inclusion proof, signed checkpoint) for one span."""
    from otel_agenttape.commands.integrity import cmd_prove as run

    return run(args)


def cmd_verify_proof(args: argparse.Namespace) -> int:
    """Check a proof file offline against a public key."""
    from otel_agenttape.commands.integrity import cmd_verify_proof as run

    return run(args)


def cmd_demo(args: argparse.Namespace) -> int:
    """Record a scripted multi-agent run through a local receiver, then show, replay and verify it."""
    import json

    from otel_agenttape.demo import run_demo
    from otel_agenttape.receiver.server import read_discovery
    from otel_agenttape.store.reader import StoreError, open_reader
    from otel_agenttape.tape.rebuild import reconstruct_tree
    from otel_agenttape.tape.verification import verify_store

    if args.json and args.serve:
        raise CliError("--serve prints the console's URL as text: use it without --json")
    holder = read_discovery(args.db)
    if holder is not None:
        raise CliError(f"cannot run the demo: {args.db} is in use by `agenttape serve` (pid {holder['pid']} at "
                       f"{holder.get('url')}); use another --db")
    try:
        result = run_demo(args.db)
    except (OSError, StoreError) as exc:
        raise CliError(f"cannot run the demo: {exc}") from None
    try:
        reader = open_reader(args.db)
    except StoreError as exc:
        raise CliError(str(exc)) from None
    try:
        tree = reconstruct_tree(reader, result["run_id"])
        reports = verify_store(reader)
    finally:
        reader.close()
    tape_run = [r for r in reports if r.chain_id == result["run_id"]] or reports
    valid = bool(tape_run) and all(r.valid for r in tape_run)
    if args.json:
        print(json.dumps({
            "db": args.db, "run_id": result["run_id"], "children": result["children"],
            "outputs": result["outputs"], "spans": result["spans"], "runs": result["runs"],
            "verified": valid, "seconds": result["seconds"],
            "tree": tree.root.to_json(children=True),
        }, default=str, indent=2))
        return EXIT_OK if valid else EXIT_FAILED
    print(f"Recorded the demo through OTLP into {args.db}: {result['spans']} spans "
          f"in {result['seconds']} s (capture dropped {result['capture_stats'].get('spans_dropped', 0)}).")
    print()
    print(f"{'run':34} {'agent':12} {'status':10} {'model':>5} {'tool':>5} {'tokens in/out':>14}")
    for r in result["runs"]:
        tokens = f"{r.get('input_tokens') or 0}/{r.get('output_tokens') or 0}"
        print(f"{r['run_id']:34} {str(r['agent']):12} {r['status']:10} {r['model_nodes']:>5} "
              f"{r['tool_nodes']:>5} {tokens:>14}")
    print()
    print("Tape tree (rebuilt from the store, no model call):")

    def show(run, indent: str = "  ") -> None:
        tools = ", ".join(f"{t.name}{' (error)' if t.error else ''}" for t in run.tools)
        print(f"{indent}{run.agent} [{run.status}] {run.run_id}" + (f"  tools: {tools}" if tools else ""))
        out = str(run.output or "")
        print(f"{indent}  -> {out[:110]}{'...' if len(out) > 110 else ''}")
        for child in run.children:
            show(child, indent + "    ")

    show(tree.root)
    print()
    for r in tape_run:
        state = "verified" if r.valid else f"BROKEN at {r.first_broken_index}: {r.reason}"
        print(f"Integrity: tape {r.chain_id} epoch {r.epoch}: {r.length} sealed spans, {state}")
    rid = result["run_id"]
    print()
    print("Next:")
    print(f"  agenttape runs --db {args.db}")
    print(f"  agenttape show {rid} --db {args.db}")
    print(f"  agenttape replay {rid} --tree --json --db {args.db}")
    print(f"  agenttape verify --db {args.db}")
    print(f"  agenttape sql \"SELECT name, duration_ms FROM spans ORDER BY start_time_unix_nano\" --db {args.db}")
    print("  agenttape serve   # then point any OTLP exporter at http://127.0.0.1:4318")
    from otel_agenttape.console.cli import demo_console

    demo_console(args.db, serve=args.serve, port=args.console_port)
    return EXIT_OK if valid else EXIT_FAILED


def cmd_console(args: argparse.Namespace) -> int:
    """Serve the web console over a store, a lake or OTLP files (read-only), until SIGINT/SIGTERM."""
    from otel_agenttape.console.cli import run

    return run(args)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check packages, export settings, the store and a running receiver; list every loss counter."""
    import json

    from otel_agenttape.doctor import diagnose

    checks = diagnose(args.db)
    if args.json:
        print(json.dumps([{"name": c.name, "ok": c.ok, "status": c.status, "detail": c.detail, "data": c.data}
                          for c in checks],
                         indent=2, default=str))
    else:
        for c in checks:
            print(f"{c.status:<4}  {c.name}: {c.detail}")
        print("Capture counters (spans dropped, exporter errors, cut payloads) live in the agent process: "
              "tape.stats().")
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agenttape",
        description="Record, store, verify and replay AI agent runs as OpenTelemetry data.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    # Subcommands register themselves below (one block each).
    p = sub.add_parser("demo", help="record a scripted multi-agent run offline, then show and verify it")
    p.add_argument("--db", default=default_db(), help="DuckDB file to record into (default %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--serve", action="store_true", help="then serve the console on the demo's store until Ctrl-C")
    p.add_argument("--console-port", type=int, default=None, help="the console's port with --serve (default 4380)")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("console", help="browse runs, trees, diffs and verification in a web page (read-only)")
    p.add_argument("files", nargs="*", metavar="FILE", help="OTLP files (JSON, JSON lines, protobuf, .gz)")
    p.add_argument("--db", default=None, help="DuckDB tape store (env AGENTTAPE_DB, default ./agenttape.duckdb)")
    p.add_argument("--lake", metavar="DIR", default=None, help="a Parquet lake folder")
    p.add_argument("--host", default=_env("CONSOLE_HOST", "127.0.0.1"), help="bind address (default %(default)s)")
    p.add_argument("--port", type=int, default=None, help="port, 0 = any free one (env AGENTTAPE_CONSOLE_PORT, "
                   "default 4380)")
    p.add_argument("--token", default=_env("TOKEN"), help="require this bearer token for every read (env AGENTTAPE_TOKEN)")
    p.add_argument("--insecure-no-auth", action="store_true", help="allow a non-loopback address without a token")
    p.add_argument("--json", action="store_true", help="print the startup line as JSON")
    p.set_defaults(func=cmd_console)
    p = sub.add_parser("doctor", help="check packages, export settings, store and receiver; show loss counters")
    p.add_argument("--db", default=default_db(), help="DuckDB file (default %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("serve", help="run the OTLP receiver (gRPC + HTTP) writing to the tape store")
    p.add_argument("--db", default=default_db(), help="DuckDB file (env AGENTTAPE_DB)")
    p.add_argument("--host", default=_env("HOST", "127.0.0.1"), help="bind address (env AGENTTAPE_HOST)")
    p.add_argument("--http-port", type=int, default=None,
                   help="OTLP/HTTP port, 0 = any free port (env AGENTTAPE_HTTP_PORT, default 4318)")
    p.add_argument("--grpc-port", type=int, default=None,
                   help="OTLP/gRPC port, 0 = any free port (env AGENTTAPE_GRPC_PORT, default 4317)")
    p.add_argument("--parquet-dir", default=_env("PARQUET_DIR"), help="also write a Parquet lake here")
    p.add_argument("--token", default=_env("TOKEN"), help="require Authorization: Bearer TOKEN (env AGENTTAPE_TOKEN)")
    p.add_argument("--ingest-workers", type=int, default=None, metavar="N",
                   help="processes decoding and converting requests to rows (default: one per core, max 4; 0: none)")
    p.add_argument("--query-timeout", type=float, default=None, metavar="SECONDS",
                   help="interrupt a POST /api/query (and `agenttape sql`) query after this long (default 30; 0: never)")
    from otel_agenttape.receiver import limits as lim  # the defaults live with the receiver (no heavy imports)

    p.add_argument("--max-body", type=int, default=lim.DEFAULT_MAX_BODY, metavar="BYTES",
                   help="largest request body, also after decompression (default %(default)s: 20 MiB); more gets 413")
    p.add_argument("--max-spans-per-request", type=int, default=lim.DEFAULT_MAX_SPANS_PER_REQUEST, metavar="N",
                   help="most spans (or log records) in one request (default %(default)s); more gets 413")
    p.add_argument("--max-connections", type=int, default=lim.DEFAULT_MAX_CONNECTIONS, metavar="N",
                   help="open HTTP connections served (default %(default)s); past it requests get 503 + Retry-After")
    p.add_argument("--header-timeout", type=float, default=lim.DEFAULT_HEADER_TIMEOUT, metavar="S",
                   help="seconds for a request's headers to arrive (default %(default)s); then 408 and closed")
    p.add_argument("--body-timeout", type=float, default=lim.DEFAULT_BODY_TIMEOUT, metavar="S",
                   help="seconds for a request's body to arrive (default %(default)s); then 408 and closed")
    p.add_argument("--idle-timeout", type=float, default=lim.DEFAULT_IDLE_TIMEOUT, metavar="S",
                   help="seconds a kept-alive HTTP connection may wait for its next request (default %(default)s)")
    p.add_argument("--no-span-metrics", action="store_true",
                   help="do not derive GenAI/agent metrics from stored spans (env AGENTTAPE_SPAN_METRICS=0)")
    p.add_argument("--metrics-otlp-endpoint", default=_env("METRICS_OTLP_ENDPOINT"), metavar="URL",
                   help="also push /metrics over OTLP/HTTP to this collector URL (env AGENTTAPE_METRICS_OTLP_ENDPOINT)")
    p.add_argument("--metrics-otlp-interval", type=float, default=15.0, metavar="SECONDS",
                   help="seconds between OTLP metric exports (default %(default)s)")
    p.add_argument("--no-console", action="store_true", help="do not serve the web console at / and /api/")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="serve the console on a non-loopback address without a token")
    p.add_argument("--json", action="store_true", help="print the startup line as JSON")
    _lake_serve_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("ingest", help="load OTLP JSON / JSON lines / protobuf files (.gz too) into the store")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="an OTLP file, or an outbox folder (its records not yet acknowledged)")
    p.add_argument("--db", default=default_db(), help="DuckDB file (env AGENTTAPE_DB)")
    p.add_argument("--signal", choices=["traces", "logs"], default=None,
                   help="what a protobuf file holds (default: logs if its name contains 'log')")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("show", help="print a recorded run's ordered step stream")
    p.add_argument("run", metavar="RUN", help="run id (or the trace id of another instrumentation's run)")
    p.add_argument("--json", action="store_true", help="steps as JSON")
    _tape_source_args(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("replay", help="rebuild a run (prompt, output, tool calls) with no model call")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--tree", action="store_true", help="include every child run (multi-agent)")
    p.add_argument("--json", action="store_true", help="print the replay JSON contract (docs/replay.md)")
    _tape_source_args(p)
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("diff", help="show the first node where two runs diverge (exit 1 when they do)")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--json", action="store_true")
    _tape_source_args(p)
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("dataset", help="export completed runs as OpenAI chat fine-tuning JSONL")
    p.add_argument("out", metavar="OUT.jsonl", help="output file ('-' for stdout)")
    p.add_argument("--agent", default=None, help="only runs of this agent")
    p.add_argument("--model", default=None, help="only runs that used this model")
    p.add_argument("--since", default=None, metavar="T", help="only runs started at or after T (ISO date/time)")
    p.add_argument("--json", action="store_true", help="also print the counts as JSON")
    _tape_source_args(p)
    p.set_defaults(func=cmd_dataset)

    p = sub.add_parser("runs", help="list recorded runs of every instrumentation, newest first")
    _tape_source_args(p)
    p.add_argument("--limit", type=int, default=20, help="how many runs (default 20)")
    p.add_argument("--agent", default=None, help="only runs of this agent")
    p.add_argument("--status", default=None, help="only runs with this status (completed, error, incomplete, ...)")
    p.add_argument("--source", default=None,
                   help="only runs recorded by this source (agenttape, otel-genai, openinference, openllmetry, ...)")
    p.add_argument("--session", default=None, help="only the runs (turns) of this session")
    p.add_argument("--since", default=None, metavar="T", help="only runs started at or after T (ISO date/time)")
    p.add_argument("--json", action="store_true", help="print a JSON array")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("sql", help="run one read-only SQL query (tables and views: docs/schema.md)")
    p.add_argument("query", metavar="QUERY")
    p.add_argument("--db", default=default_db(), help="DuckDB file or Parquet lake folder (env AGENTTAPE_DB)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print a JSON array")
    fmt.add_argument("--csv", action="store_true", help="print CSV with a header row")
    _lake_read_arg(p)
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="interrupt the query after this long (default %(default)s; 0: never; a server's own limit still applies)")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("export", help="export the store (export parquet DIR)")
    what = p.add_subparsers(dest="format", metavar="FORMAT")
    what.required = True
    q = what.add_parser("parquet", help="write a Parquet lake: DIR/<table>/date=YYYY-MM-DD/*.parquet, zstd")
    q.add_argument("dir", metavar="DIR")
    q.add_argument("--db", default=default_db(), help="DuckDB file (env AGENTTAPE_DB)")
    q.add_argument("--overwrite", action="store_true", help="replace table folders already in DIR")
    q.add_argument("--json", action="store_true", help="print the row counts as JSON")
    q.set_defaults(func=cmd_export)
    p = sub.add_parser("resume-index", help="rebuild a run's resume index (JSON) from the store or OTLP files")
    p.add_argument("run", metavar="RUN", help="run id")
    p.add_argument("--out", required=True, metavar="FILE", help="JSON file for ResumeIndex.load_json")
    p.add_argument("--db", default=default_db(), help="DuckDB tape store (env AGENTTAPE_DB)")
    p.add_argument("--parquet", metavar="DIR", default=None, help="read a Parquet lake instead of --db")
    p.add_argument("--otlp", metavar="FILE", nargs="+", default=None, help="read OTLP files instead of --db")
    _lake_read_arg(p)
    p.add_argument("--json", action="store_true", help="print the entry counts as JSON")
    p.set_defaults(func=cmd_resume_index)

    p = sub.add_parser("keygen", help="create an Ed25519 key that signs tape checkpoints")
    p.add_argument("--out", default="agenttape", metavar="PREFIX", help="writes PREFIX.key and PREFIX.pub")
    p.add_argument("--name", default=None, help="key name (default agenttape.<host>)")
    p.add_argument("--force", action="store_true", help="replace existing key files")
    p.set_defaults(func=cmd_keygen)
    for name, helptext, func in (
        ("verify", "verify sealed tapes: chains, gaps, Merkle roots, checkpoints (exit 1 on failure)", cmd_verify),
        ("prove", "write a self-contained proof that one span is in its signed tape", cmd_prove),
    ):
        p = sub.add_parser(name, help=helptext)
        if name == "prove":
            p.add_argument("span_id", metavar="SPAN_ID")
            p.add_argument("--out", required=True, metavar="FILE")
        else:
            p.add_argument("--run", default=None, metavar="ID", help="only the tape of this run")
            p.add_argument("--json", action="store_true", help="one JSON object per chain")
        p.add_argument("--key", action="append", metavar="PUB", help="trusted public key (file or vkey)")
        p.add_argument("--checkpoints", action="append", metavar="FILE", help="local checkpoint file (JSON lines)")
        _tape_source_args(p)
        p.set_defaults(func=func)
    p = sub.add_parser("lake", help="maintain a lake: compact, retain, status")
    what = p.add_subparsers(dest="lake_command", metavar="VERB")
    what.required = True
    for verb, helptext in (("compact", "merge small Parquet files (atomic, idempotent, safe while receivers publish)"),
                           ("retain", "drop whole date partitions older than --older-than, recording what went"),
                           ("status", "files, rows and receivers the manifest lists")):
        q = what.add_parser(verb, help=helptext)
        q.add_argument("lake", metavar="LAKE", help="lake folder or s3://bucket/prefix")
        if verb == "compact":
            q.add_argument("--target-mb", type=float, default=256, help="merged file size (default 256 MB)")
        if verb == "retain":
            q.add_argument("--older-than", required=True, metavar="DAYS", help="e.g. 30d: UTC dates before today-30")
        if verb != "status":
            q.add_argument("--grace", type=float, default=600, metavar="SECONDS",
                           help="delete replaced files only this long after (default 600; readers may still use them)")
        q.add_argument("--json", action="store_true")
        q.set_defaults(func=cmd_lake)
    p = sub.add_parser("verify-proof", help="check a proof file offline against a public key")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--key", action="append", metavar="PUB", help="trusted public key (file or vkey)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify_proof)
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
    except BrokenPipeError:
        # The reader of our output went away (``| head``): not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    # Run through the imported module so command modules and this block share one CliError class.
    from otel_agenttape.cli import main as _main

    sys.exit(_main())
