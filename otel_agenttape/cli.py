"""The ``agenttape`` command: builds the argument parser and dispatches to the verb's module.

Each subcommand is ``otel_agenttape.commands.<verb>.run(args) -> int``, imported only when it runs (so
``agenttape --help`` stays fast). Exit codes (``commands.errors``): 0 success, 1 the command ran and found a
problem (for example a tape that does not verify), 2 usage or input error (bad arguments, unreadable file,
bad query).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from otel_agenttape.commands.serve import port as _port

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "CliError", "default_db", "main"]
# ``_port`` stays importable here: the console's command line reads ``--port`` the way ``serve`` does.


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"AGENTTAPE_{name}", default)


def _seconds(text: str) -> float:
    """A duration in seconds, 0 or more (argparse names the flag when it is not)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text}")
    return value


def default_db() -> str:
    return _env("DB", "./agenttape.duckdb") or "./agenttape.duckdb"


def _verb(module: str) -> Callable[[argparse.Namespace], int]:
    """``otel_agenttape.commands.<module>.run``, imported when the command runs."""

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(f"otel_agenttape.commands.{module}").run(args)  # type: ignore[no-any-return]

    run.__name__ = run.__qualname__ = f"run_{module}"
    return run


def _tape_source_args(p: argparse.ArgumentParser, prices: bool = False) -> None:
    p.add_argument("--db", default=default_db(), help="DuckDB tape store (env AGENTTAPE_DB)")
    p.add_argument("--parquet", metavar="DIR", default=None, help="read a Parquet lake instead of --db")
    p.add_argument("--otlp", metavar="FILE", nargs="+", default=None,
                   help="read OTLP files (JSON, JSON lines, protobuf, .gz) instead of --db")
    _lake_read_arg(p)
    if prices:  # only on the commands that print cost
        _prices_arg(p)


def _prices_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prices", metavar="FILE", default=None,
                   help="per-model prices per million tokens (JSON or YAML) over genai-prices' "
                        "(env AGENTTAPE_PRICES)")


def _score_filter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--score", action="append", default=None, metavar="NAME>=V",
                   help="only runs whose latest NAME score passes (>=, >, <=, <, =), e.g. helpfulness>=0.8; "
                        "repeat for several")
    p.add_argument("--label", action="append", default=None, metavar="NAME=LABEL",
                   help="only runs whose latest NAME score has this label, e.g. correctness=pass; repeat for several")


def _lake_read_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lake", action="append", metavar="LAKE", default=None,
                   help="read a lake (folder, s3://bucket/prefix or iceberg+... catalog URL) instead of --db; repeat it to read several "
                        "lakes and DuckDB files as one store")


def _lake_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lake", default=_env("LAKE"), metavar="DIR|s3://BUCKET/PREFIX|iceberg+...",
                   help="also publish immutable Parquet files and a manifest into this lake, or append them to "
                        "Apache Iceberg tables through a catalog URL (env AGENTTAPE_LAKE)")
    p.add_argument("--receiver-id", default=_env("RECEIVER_ID"), metavar="ID",
                   help="this receiver's name in the lake (env AGENTTAPE_RECEIVER_ID, default the host name)")
    p.add_argument("--lake-interval", type=float, default=None, metavar="SECONDS",
                   help="publish at least this often while rows arrive (default 60)")
    p.add_argument("--lake-max-spans", type=int, default=None, metavar="N",
                   help="publish as soon as N spans wait, and at most N spans per batch (default 200000)")


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
    p.add_argument("--console-port", type=int, default=None, help="the console's port with --serve (env AGENTTAPE_CONSOLE_PORT, default 4380)")
    p.set_defaults(func=_verb("demo"))
    p = sub.add_parser("console", help="browse runs, trees, diffs and verification in a web page (read-only)")
    p.add_argument("files", nargs="*", metavar="FILE", help="OTLP files (JSON, JSON lines, protobuf, .gz)")
    p.add_argument("--db", default=None, help="DuckDB tape store (env AGENTTAPE_DB, default ./agenttape.duckdb)")
    p.add_argument("--lake", metavar="DIR", default=None, help="a Parquet lake folder")
    _prices_arg(p)
    p.add_argument("--host", default=_env("CONSOLE_HOST", "127.0.0.1"), help="bind address (default %(default)s)")
    p.add_argument("--port", type=int, default=None, help="port, 0 = any free one (env AGENTTAPE_CONSOLE_PORT, "
                   "default 4380)")
    p.add_argument("--token", default=_env("TOKEN"), help="require this bearer token for every read (env AGENTTAPE_TOKEN)")
    p.add_argument("--annotate-token", default=_env("ANNOTATE_TOKEN"), metavar="T",
                   help="let people holding this token (header X-Agenttape-Annotate-Token, not --token) score runs "
                        "and nodes from the page (env AGENTTAPE_ANNOTATE_TOKEN)")
    p.add_argument("--annotate-endpoint", default=None, metavar="URL",
                   help="the receiver annotations are sent to (default OTEL_EXPORTER_OTLP_ENDPOINT, else the "
                        "receiver serving --db)")
    p.add_argument("--annotate-receiver-token", default=None, metavar="T",
                   help="the bearer token that receiver requires")
    p.add_argument("--insecure-no-auth", action="store_true", help="allow a non-loopback address without a token")
    p.add_argument("--json", action="store_true", help="print the startup line as JSON")
    p.set_defaults(func=_verb("console"))
    p = sub.add_parser("doctor", help="check packages, export settings, store and receiver; show loss counters")
    p.add_argument("--db", default=default_db(), help="DuckDB file (default %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_verb("doctor"))
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
    p.add_argument("--memory-limit", default=_env("MEMORY_LIMIT"), metavar="SIZE",
                   help="the receiver's memory, split between DuckDB, the ingest queue and the converter spool "
                        "(default 512MB; env AGENTTAPE_MEMORY_LIMIT; see docs/operations.md)")
    p.add_argument("--release-after", type=_seconds, default=_env("RELEASE_AFTER", "60"), metavar="SECONDS",
                   help="after this long with no write, read or request, stop the converter processes and give "
                        "DuckDB's cached blocks back; they return when needed (default 60; 0: never; "
                        "env AGENTTAPE_RELEASE_AFTER)")
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
    p.add_argument("--annotate-token", default=_env("ANNOTATE_TOKEN"), metavar="T",
                   help="let the console take scores from people holding this token (header "
                        "X-Agenttape-Annotate-Token; env AGENTTAPE_ANNOTATE_TOKEN)")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="serve the console on a non-loopback address without a token")
    p.add_argument("--json", action="store_true", help="print the startup line as JSON")
    _lake_serve_args(p)
    p.set_defaults(func=_verb("serve"))

    p = sub.add_parser("ingest", help="load OTLP JSON / JSON lines / protobuf files (.gz too) into the store")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="an OTLP file, or an outbox folder (its spans and log records not yet acknowledged)")
    p.add_argument("--db", default=default_db(), help="DuckDB file (env AGENTTAPE_DB)")
    p.add_argument("--signal", choices=["traces", "logs"], default=None,
                   help="what a protobuf file holds (default: logs if its name contains 'log')")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_verb("ingest"))

    p = sub.add_parser("show", help="print a recorded run's ordered step stream")
    p.add_argument("run", metavar="RUN", help="run id (or the trace id of another instrumentation's run)")
    p.add_argument("--json", action="store_true", help="steps as JSON")
    _tape_source_args(p, prices=True)
    p.set_defaults(func=_verb("show"))

    p = sub.add_parser("replay", help="rebuild a run (prompt, output, tool calls) with no model call")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--tree", action="store_true", help="include every child run (multi-agent)")
    p.add_argument("--json", action="store_true", help="print the replay JSON contract (docs/replay.md)")
    _tape_source_args(p, prices=True)
    p.set_defaults(func=_verb("replay"))

    p = sub.add_parser("diff", help="show the first node where two runs diverge (exit 1 when they do)")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--json", action="store_true")
    _tape_source_args(p)
    p.set_defaults(func=_verb("diff"))

    p = sub.add_parser("dataset", help="export completed runs as OpenAI chat fine-tuning JSONL")
    p.add_argument("out", metavar="OUT.jsonl", help="output file ('-' for stdout)")
    p.add_argument("--agent", default=None, help="only runs of this agent")
    p.add_argument("--model", default=None, help="only runs that used this model")
    p.add_argument("--since", default=None, metavar="T", help="only runs started at or after T (ISO date/time)")
    _score_filter_args(p)
    p.add_argument("--json", action="store_true", help="also print the counts as JSON")
    _tape_source_args(p)
    p.set_defaults(func=_verb("dataset"))

    p = sub.add_parser("runs", help="list recorded runs of every instrumentation, newest first")
    _tape_source_args(p, prices=True)
    p.add_argument("--limit", type=int, default=20, help="how many runs (default 20)")
    p.add_argument("--agent", default=None, help="only runs of this agent")
    p.add_argument("--status", default=None, help="only runs with this status (completed, error, incomplete, ...)")
    p.add_argument("--source", default=None,
                   help="only runs recorded by this source (agenttape, otel-genai, openinference, openllmetry, ...)")
    p.add_argument("--session", default=None, help="only the runs (turns) of this session")
    p.add_argument("--since", default=None, metavar="T", help="only runs started at or after T (ISO date/time)")
    p.add_argument("--experiment", default=None, metavar="NAME", help="only the runs of this experiment")
    _score_filter_args(p)
    p.add_argument("--json", action="store_true", help="print a JSON array")
    p.set_defaults(func=_verb("runs"))

    from otel_agenttape.commands import score as _score

    _score.add_parser(sub)

    from otel_agenttape.commands import experiment as _experiment

    _experiment.add_parser(sub, _tape_source_args)

    from otel_agenttape.commands import eval as _eval

    _eval.add_parser(sub, _tape_source_args)

    p = sub.add_parser("sql", help="run one read-only SQL query (tables and views: docs/schema.md)")
    p.add_argument("query", metavar="QUERY")
    p.add_argument("--db", default=default_db(), help="DuckDB file or Parquet lake folder (env AGENTTAPE_DB)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print a JSON array")
    fmt.add_argument("--csv", action="store_true", help="print CSV with a header row")
    _lake_read_arg(p)
    _prices_arg(p)
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="interrupt the query after this long (default %(default)s; 0: never; a server's own limit still applies)")
    p.set_defaults(func=_verb("sql"))

    p = sub.add_parser("export", help="export the store (export parquet DIR)")
    what = p.add_subparsers(dest="format", metavar="FORMAT")
    what.required = True
    q = what.add_parser("parquet", help="write a Parquet lake: DIR/<table>/date=YYYY-MM-DD/*.parquet, zstd")
    q.add_argument("dir", metavar="DIR")
    q.add_argument("--db", default=default_db(), help="DuckDB file (env AGENTTAPE_DB)")
    q.add_argument("--overwrite", action="store_true", help="replace table folders already in DIR")
    q.add_argument("--json", action="store_true", help="print the row counts as JSON")
    q.set_defaults(func=_verb("export"))
    p = sub.add_parser("resume-index", help="rebuild a run's resume index (JSON) from the store or OTLP files")
    p.add_argument("run", metavar="RUN", help="run id")
    p.add_argument("--out", required=True, metavar="FILE", help="JSON file for ResumeIndex.load_json")
    p.add_argument("--db", default=default_db(), help="DuckDB tape store (env AGENTTAPE_DB)")
    p.add_argument("--parquet", metavar="DIR", default=None, help="read a Parquet lake instead of --db")
    p.add_argument("--otlp", metavar="FILE", nargs="+", default=None, help="read OTLP files instead of --db")
    _lake_read_arg(p)
    p.add_argument("--json", action="store_true", help="print the entry counts as JSON")
    p.set_defaults(func=_verb("resume_index"))

    p = sub.add_parser("keygen", help="create an Ed25519 key that signs tape checkpoints")
    p.add_argument("--out", default="agenttape", metavar="PREFIX", help="writes PREFIX.key and PREFIX.pub")
    p.add_argument("--name", default=None, help="key name (default agenttape.<host>)")
    p.add_argument("--force", action="store_true", help="replace existing key files")
    p.set_defaults(func=_verb("keygen"))
    for name, helptext, func in (
        ("verify", "verify sealed tapes: chains, gaps, Merkle roots, checkpoints (exit 1 on failure)", _verb("verify")),
        ("prove", "write a self-contained proof that one span is in its signed tape", _verb("prove")),
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
    p = sub.add_parser("erase", help="erase the content of a session, run, trace or time range (tapes still verify)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--session", default=None, metavar="S", help="every run of this session")
    which.add_argument("--run", default=None, metavar="REF", help="one run (RUN or RUN@TRACE)")
    which.add_argument("--trace", default=None, metavar="T", help="one trace id")
    which.add_argument("--before", default=None, metavar="TIME", help="spans started before this ISO time")
    which.add_argument("--where", default=None, metavar="SQL",
                       help="spans this read-only SQL predicate over spans selects, e.g. \"agent_name = 'support'\"")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (written into the erasure record)")
    p.add_argument("--by", default=None, metavar="WHO", help="who asked (default user@host)")
    p.add_argument("--signing-key", default=None, metavar="KEY",
                   help="key file that signs the record (default $AGENTTAPE_SIGNING_KEY, else ephemeral)")
    p.add_argument("--dry-run", action="store_true", help="print what would be erased; change nothing")
    p.add_argument("--parquet", action="append", default=[], dest="copy_parquet", metavar="DIR",
                   help="also erase in this Parquet export (export parquet, serve --parquet-dir); repeatable")
    p.add_argument("--lake", action="append", default=[], dest="copy_lake", metavar="DIR|s3://...",
                   help="also erase in this lake: folder, s3:// or iceberg+... (a new snapshot; the old files "
                        "deleted); repeatable")
    p.add_argument("--wal", action="append", default=[], dest="copy_wal", metavar="DIR",
                   help="also erase in this receiver write-ahead log (DB.otlpwal is always included); repeatable")
    p.add_argument("--outbox", action="append", default=[], dest="copy_outbox", metavar="DIR",
                   help="also erase in this agent outbox folder (its processes stopped); repeatable")
    p.add_argument("--json", action="store_true")
    p.add_argument("--db", default=default_db(), help="DuckDB tape store (env AGENTTAPE_DB)")
    p.set_defaults(func=_verb("erase"))
    p = sub.add_parser("retain", help="drop (or only erase the content of) spans older than --older-than in a "
                                      "DuckDB store, recorded so verify tells retention from tampering")
    p.add_argument("--older-than", required=True, metavar="DAYS", help="e.g. 30d: UTC dates before today-30 "
                   "(the rule of lake retain)")
    p.add_argument("--content-only", action="store_true",
                   help="erase their content (a signed erasure record) and keep the spans and their proofs")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (written into the record)")
    p.add_argument("--by", default=None, metavar="WHO", help="who asked (default user@host)")
    p.add_argument("--signing-key", default=None, metavar="KEY",
                   help="with --content-only: key file that signs the erasure record (as erase)")
    p.add_argument("--dry-run", action="store_true", help="print what would go; change nothing")
    p.add_argument("--json", action="store_true")
    p.add_argument("--db", default=default_db(), help="DuckDB tape store (env AGENTTAPE_DB)")
    p.set_defaults(func=_verb("retain"))
    p = sub.add_parser("lake", help="maintain a lake: compact, retain, status, migrate")
    what = p.add_subparsers(dest="lake_command", metavar="VERB")
    what.required = True
    for verb, helptext in (("compact", "merge small Parquet files (atomic, idempotent, safe while receivers publish)"),
                           ("retain", "drop whole date partitions older than --older-than, recording what went"),
                           ("status", "files, rows and receivers the lake lists"),
                           ("migrate", "copy a folder/S3 lake into an Iceberg lake (resumable, idempotent)")):
        q = what.add_parser(verb, help=helptext)
        q.add_argument("lake", metavar="LAKE", help="lake folder, s3://bucket/prefix or iceberg+... catalog URL")
        if verb == "migrate":
            q.add_argument("target", metavar="ICEBERG_URL", help="iceberg+sql:///PATH.db#ns, iceberg+postgresql://...")
        if verb == "compact":
            q.add_argument("--target-mb", type=float, default=256, help="merged file size (default 256 MB)")
        if verb == "retain":
            q.add_argument("--older-than", required=True, metavar="DAYS", help="e.g. 30d: UTC dates before today-30")
        if verb not in ("status", "migrate"):
            q.add_argument("--grace", type=float, default=600, metavar="SECONDS",
                           help="delete replaced files only this long after (default 600; readers may still use them)")
        q.add_argument("--json", action="store_true")
        q.set_defaults(func=_verb("lake"))
    p = sub.add_parser("verify-proof", help="check a proof file offline against a public key")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--key", action="append", metavar="PUB", help="trusted public key (file or vkey)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_verb("verify_proof"))
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
    sys.exit(main())
