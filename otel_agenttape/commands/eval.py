"""``agenttape eval EVALUATOR``: score recorded runs with a built-in check, an LLM judge or a custom
function (``MODULE:FUNCTION``), through ``tape.evaluate``.

Scores leave as telemetry, over OTLP to a receiver: the one serving ``--db`` when there is one, else a
receiver this command starts on the file for the duration (as ``agenttape demo`` does), so the scores are
sealed and stored like any tape.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK, CliError, reported
from otel_agenttape.commands.sources import source_of, store_errors, with_prices


# tape.evaluators.BUILTINS, named here so that building the parser imports nothing heavy
BUILTIN_NAMES = ("json_valid", "regex", "contains", "exact_match", "tool_error_rate", "latency_budget", "cost_budget",
                 "llm_judge")


def add_parser(sub: Any, source_args: Any) -> None:
    """The ``eval`` command (called by ``cli._build_parser``)."""
    p = sub.add_parser("eval", help="score recorded runs with a built-in check, an LLM judge or MODULE:FUNCTION "
                                    "(a rerun of the same evaluator adds nothing)")
    p.add_argument("evaluator", metavar="EVALUATOR", help=f"{', '.join(BUILTIN_NAMES)}, or MODULE:FUNCTION")
    p.add_argument("--run", action="append", default=None, metavar="RUN", help="only this run (repeatable)")
    p.add_argument("--agent", default=None, help="only runs of this agent")
    p.add_argument("--status", default=None, help="only runs with this status")
    p.add_argument("--source", default=None, help="only runs recorded by this source")
    p.add_argument("--session", default=None, help="only the runs (turns) of this session")
    p.add_argument("--model", default=None, help="only runs that used this model")
    p.add_argument("--tool", default=None, help="only runs that called this tool")
    p.add_argument("--since", default=None, metavar="T", help="only runs started at or after T (ISO date/time)")
    p.add_argument("--until", default=None, metavar="T", help="only runs started before T")
    p.add_argument("--limit", type=int, default=None, help="at most this many runs (oldest first)")
    p.add_argument("--pattern", default=None, metavar="RE", help="regex: the expression; contains: the text")
    p.add_argument("--reference", default=None, metavar="FILE",
                   help="exact_match: JSONL lines {\"input\": ..., \"expected\": ...}")
    p.add_argument("--budget-ms", type=float, default=None, metavar="N", help="latency_budget: milliseconds")
    p.add_argument("--budget-usd", type=float, default=None, metavar="X", help="cost_budget: dollars per run")
    p.add_argument("--max-rate", type=float, default=None, metavar="R",
                   help="tool_error_rate: the highest share of failed tool calls that passes (default 0)")
    p.add_argument("--judge-model", default=None, metavar="M", help="llm_judge: the judge model")
    p.add_argument("--judge-base-url", default=None, metavar="URL",
                   help="llm_judge: any OpenAI-compatible endpoint (default the OpenAI API)")
    p.add_argument("--judge-api-key-env", default=None, metavar="VAR",
                   help="llm_judge: environment variable holding the API key (default OPENAI_API_KEY)")
    p.add_argument("--judge-timeout", type=float, default=30.0, metavar="S",
                   help="llm_judge: seconds per answer (default %(default)s); then error.type timeout")
    p.add_argument("--rubric", default=None, metavar="FILE", help="llm_judge: the rubric (text)")
    p.add_argument("--name", default=None, help="record the scores under this name instead of the evaluator's")
    p.add_argument("--version", dest="eval_version", default=None, metavar="V",
                   help="the evaluator's version (a new one scores every run again)")
    p.add_argument("--concurrency", type=int, default=4, help="runs evaluated at once (default %(default)s)")
    p.add_argument("--rescore", action="store_true", help="score runs this evaluator already scored again")
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help="OTLP/HTTP receiver the scores go to (default: the one serving --db, else one started "
                        "on --db for the duration)")
    p.add_argument("--outbox", default=None, metavar="DIR",
                   help="keep scores the receiver cannot take here and send them later (env AGENTTAPE_OUTBOX; "
                        "default DB.outbox when this command starts the receiver)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    source_args(p, prices=True)
    p.set_defaults(func=run)


def load_custom(spec: str) -> Any:
    """``MODULE:FUNCTION`` (the current folder importable): the function or ``Evaluator`` it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CliError(f"{spec!r}: give a built-in evaluator's name or MODULE:FUNCTION")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import {module_name}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise CliError(f"{module_name} has no {attr}")
    if not callable(obj):
        raise CliError(f"{spec} is not a function")
    return obj


def build(args: argparse.Namespace) -> Any:
    """The evaluator the arguments name."""
    from otel_agenttape.tape.evaluate import as_evaluator
    from otel_agenttape.tape.evaluators import builtin

    if ":" in args.evaluator:
        fn = load_custom(args.evaluator)
    else:
        judge = {"model": args.judge_model, "rubric": args.rubric, "base_url": args.judge_base_url,
                 "api_key_env": args.judge_api_key_env, "timeout": args.judge_timeout}
        try:
            fn = builtin(args.evaluator, pattern=args.pattern, reference=args.reference, budget_ms=args.budget_ms,
                         budget_usd=args.budget_usd, max_rate=args.max_rate, judge=judge)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    try:
        return as_evaluator(fn, args.name, args.eval_version)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None


def evaluate_store(store: Any, ev: Any, *, prices: str | None = None, endpoint: str | None = None,
                   outbox: str | None = None, refs: Sequence[str] = (), limit: int | None = None,
                   **options: Any) -> Any:
    """``tape.evaluate`` on what a command reads (``source_of``), the scores sent to ``endpoint``; else to
    the receiver serving a DuckDB file; else to a receiver started on the file until they are stored.
    ``options``: the run filters and ``evaluate``'s ``concurrency``, ``rescore``, ``progress``."""
    from otel_agenttape.sources import open as open_tapes
    from otel_agenttape.tape.evaluate import evaluate

    is_file = (isinstance(store, str) and "://" not in store and not os.path.isdir(store)
               and not store.endswith(".serve.json"))  # a DuckDB file (a lake, a URL or OTLP files are not)
    served = None
    if is_file and not endpoint:
        from otel_agenttape.receiver.server import read_discovery

        served = read_discovery(store)
    is_url = isinstance(store, str) and store.startswith(("http://", "https://"))  # a receiver: scores go back to it
    if not (endpoint or is_file or is_url):
        raise CliError("the scores of runs read from a lake or OTLP files need --endpoint URL "
                       "(the OTLP/HTTP receiver they are sent to)")
    if endpoint or is_url or served is not None:
        with with_prices(open_tapes(store), prices) as tapes:
            return evaluate(tapes, ev, endpoint=endpoint or (served or {}).get("url"),
                            token=(served or {}).get("token"), outbox=outbox, refs=refs, limit=limit, **options)
    if not os.path.exists(store):
        raise CliError(f"no tape store at {store} (run `agenttape serve --db {store}` or `agenttape demo`)")
    return evaluate_then_record(store, ev, prices=prices, outbox=outbox, refs=refs, limit=limit, **options)


def evaluate_then_record(db: str, ev: Any, *, prices: str | None = None, outbox: str | None = None,
                         refs: Sequence[str] = (), limit: int | None = None, concurrency: int = 4,
                         rescore: bool = False, progress: Any = None, **filters: Any) -> Any:
    """A DuckDB file no receiver holds: the runs are selected and evaluated on a read-only connection
    (a receiver's own connection reads several times slower while it writes: one thread and a memory
    limit, for ingest), then a receiver is started on the file and the scores are recorded through it,
    sealed and sent as ``evaluate`` sends them (with the outbox ``DB.outbox``, as the demo), and stored
    before it stops."""
    from otel_agenttape.receiver.server import TapeServer
    from otel_agenttape.sources import open as open_tapes
    from otel_agenttape.tape.evaluate import Recorder, as_evaluator, run_evaluation, score_tape, select_runs

    ev = as_evaluator(ev)
    kept = Recorder(None, ev)
    with with_prices(open_tapes(db), prices) as tapes:
        chosen = select_runs(tapes, refs=refs, limit=limit, **filters)
        summary = run_evaluation(tapes, ev, None, chosen, concurrency=concurrency, progress=progress,
                                 rescore=rescore, recorder=kept)
    if not kept.kept:
        summary.readable = True
        return summary
    started = time.monotonic()
    server = TapeServer(db, host="127.0.0.1", http_port=0, grpc_port=0, grpc_enabled=False, span_metrics=False)
    server.start()
    try:
        tape = score_tape(server.url, outbox=outbox or os.environ.get("AGENTTAPE_OUTBOX") or f"{db}.outbox")
        try:
            kept.record_kept(tape)
            tape.force_flush()
            tape.wait_delivered(30)
        finally:
            tape.shutdown()
        # what the receiver acknowledged is queryable once it is idle
        summary.readable = server.wait_idle(60)
        if not summary.readable:
            raise CliError("the receiver did not store every score within 60 s")
    finally:
        server.stop()
    summary.seconds += time.monotonic() - started
    return summary


def _print(summary: Any, out: TextIO) -> None:
    out.write(f"eval {summary.evaluator}: {summary.selected} runs selected, {summary.evaluated} evaluated, "
              f"{summary.skipped} skipped (already scored), {summary.errors} errors"
              + (f", {summary.not_applicable} not applicable" if summary.not_applicable else "") + "\n")
    if summary.labels:
        out.write("  labels: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.labels.items())) + "\n")
    for f in summary.failed:
        why = f": {f['explanation']}" if f["explanation"] else ""
        out.write(f"  error {f['ref']}: {f['error_type']}{why}\n")
    if summary.readable is False:
        out.write("  note: the scores were delivered but not all are readable in the store yet\n")
    if summary.errors > len(summary.failed):
        out.write(f"  ... {summary.errors - len(summary.failed)} more errors\n")


def run(args: argparse.Namespace) -> int:
    """Evaluate the selected runs; exit 1 when an evaluation failed (its error.type is recorded)."""
    ev = build(args)
    filters = {"agent": args.agent, "status": args.status, "source": args.source, "session": args.session,
               "model": args.model, "tool": args.tool, "since": args.since, "until": args.until}
    from otel_agenttape.tape.refs import AmbiguousRunError, RunNotFound

    with reported(*store_errors(), RunNotFound, AmbiguousRunError, TypeError):
        summary = evaluate_store(source_of(args), ev, prices=args.prices, endpoint=args.endpoint,
                                 outbox=args.outbox, refs=args.run or (), limit=args.limit,
                                 concurrency=args.concurrency, rescore=args.rescore, **filters)
    if args.json:
        sys.stdout.write(json.dumps(summary.to_json(), ensure_ascii=False) + "\n")
    else:
        _print(summary, sys.stdout)
    return EXIT_FAILED if summary.errors else EXIT_OK
