"""``agenttape experiment run|compare|list``: A/B a model or prompt against recorded runs (``tape.experiment``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK, CliError, reported
from otel_agenttape.commands.sources import open_tapes, source_of, store_errors


def _errors() -> tuple[type[BaseException], ...]:
    from otel_agenttape.tape.experiment import ExperimentError

    return (ExperimentError, *store_errors())


def add_parser(sub: Any, source_args: Any) -> None:
    """The ``experiment`` verbs (called by ``cli._build_parser``)."""
    p = sub.add_parser("experiment", help="A/B a model or prompt against recorded runs: run, compare, list")
    what = p.add_subparsers(dest="experiment_command", metavar="VERB")
    what.required = True
    q = what.add_parser("run", help="send every selected recorded model call to a candidate model, recording each "
                                    "answer as a run linked to the original (a rerun skips what is done)")
    q.add_argument("name", metavar="NAME")
    q.add_argument("--model", required=True, help="the candidate model")
    q.add_argument("--provider", choices=("openai", "anthropic"), default="openai",
                   help="openai: any OpenAI-compatible endpoint; anthropic: the Messages API through the "
                        "Anthropic SDK, each recorded prompt converted (default %(default)s)")
    q.add_argument("--base-url", default=None, help="the provider's endpoint (default its public API)")
    q.add_argument("--api-key-env", default=None, metavar="VAR", help="environment variable holding the API key "
                   "(default OPENAI_API_KEY, or ANTHROPIC_API_KEY with --provider anthropic)")
    q.add_argument("--system-prompt", default=None, metavar="FILE", help="replace the system prompt with this file")
    q.add_argument("--temperature", type=float, default=None)
    q.add_argument("--run", action="append", default=None, metavar="RUN", help="only this run (repeatable)")
    q.add_argument("--dataset", default=None, metavar="FILE",
                   help="JSONL: chat examples (agenttape dataset) or lines with a \"ref\"")
    q.add_argument("--agent", default=None)
    q.add_argument("--status", default=None)
    q.add_argument("--source", default=None)
    q.add_argument("--session", default=None)
    q.add_argument("--model-filter", dest="model_filter", default=None, metavar="M",
                   help="only runs that used this model")
    q.add_argument("--since", default=None, metavar="T")
    q.add_argument("--limit", type=int, default=1000, help="most runs selected (default %(default)s)")
    q.add_argument("--concurrency", type=int, default=4, help="calls in flight (default %(default)s)")
    q.add_argument("--endpoint", default=None, metavar="URL",
                   help="OTLP/HTTP receiver to record into (default: the one serving --db, else "
                        "$OTEL_EXPORTER_OTLP_ENDPOINT, else http://127.0.0.1:4318)")
    q.add_argument("--journal", default=None, metavar="FILE",
                   help="resume journal (default $AGENTTAPE_EXPERIMENTS/NAME.sqlite, ./.agenttape/experiments)")
    q.add_argument("--no-seal", action="store_true", help="do not seal the experiment's runs")
    q.add_argument("--json", action="store_true")
    source_args(q)
    q.set_defaults(func=run)
    q = what.add_parser("compare", help="answers, tool calls, tokens, latency, cost and scores against a baseline "
                                        "(exit 1 when a --fail-if gate fails)")
    q.add_argument("name", metavar="NAME")
    q.add_argument("--baseline", default="original", metavar="original|OTHER",
                   help="the recorded nodes (default) or another experiment")
    q.add_argument("--eval", action="append", default=[], metavar="E", help="an evaluator run on both sides' model calls: json_valid, contains=TEXT, regex=RE, "
                        "exact_match=FILE, latency_budget=MS, MODULE:FUNCTION, or one registered in Python")
    q.add_argument("--fail-if", action="append", default=[], metavar="GATE", help='e.g. "answer_same<0.9"')
    q.add_argument("--json", action="store_true")
    source_args(q, prices=True)
    q.set_defaults(func=run)
    q = what.add_parser("list", help="experiments in the store")
    q.add_argument("--json", action="store_true")
    source_args(q)
    q.set_defaults(func=run)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    from otel_agenttape.tape.experiment import Candidate, run_experiment

    prompt = None
    if args.system_prompt:
        try:
            prompt = Path(args.system_prompt).read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot read {args.system_prompt}: {exc.strerror or exc}") from None
    candidate = Candidate(args.model, base_url=args.base_url, api_key_env=args.api_key_env, system_prompt=prompt,
                          temperature=args.temperature, provider=args.provider)
    filters = {"agent": args.agent, "status": args.status, "source": args.source, "session": args.session,
               "model": args.model_filter, "since": args.since}
    result = run_experiment(source_of(args), args.name, candidate, refs=args.run or (), filters=filters,
                            dataset=args.dataset, endpoint=args.endpoint, journal=args.journal,
                            concurrency=args.concurrency, limit=args.limit, seal=not args.no_seal)
    if args.json:
        out.write(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
    else:
        out.write(f"experiment {result.name}: {result.selected} model calls selected, {result.answered} answered, "
                  f"{result.failed} failed, {result.skipped} already done\n")
        for r in result.runs:
            if r.get("error"):
                out.write(f"  failed {r['of']} node {r['node']}: {r['error']}\n")
    return EXIT_FAILED if result.failed else EXIT_OK


def _fmt(value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _compare(args: argparse.Namespace, out: TextIO) -> int:
    from otel_agenttape.tape.experiment_compare import check_gates

    from otel_agenttape.commands.eval import load_custom
    from otel_agenttape.tape.evaluate import as_evaluator
    from otel_agenttape.tape.experiment_compare import EVALUATORS, on_nodes, register_evaluator

    evals = []
    for spec in args.eval:  # MODULE:FUNCTION, a function of a run: scored on each side's model call, as FUNCTION
        if spec not in EVALUATORS and ":" in spec and "=" not in spec.split(":", 1)[0]:
            name = spec.rsplit(":", 1)[1]
            register_evaluator(name, on_nodes(as_evaluator(load_custom(spec))))
            spec = name
        evals.append(spec)
    with open_tapes(args) as tapes:
        cmp = tapes.compare(args.name, baseline=args.baseline, evals=evals)
    summary = cmp.summary()
    gates = check_gates(summary, args.fail_if)
    if args.json:
        doc = cmp.to_json()
        doc["gates"] = [g.to_json() for g in gates]
        out.write(json.dumps(doc, ensure_ascii=False) + "\n")
    else:
        out.write(f"experiment {cmp.name} against {cmp.baseline}\n")
        for p in cmp.pairs:
            if p.error:
                mark = "error"
            else:
                mark = {True: "same", False: "changed", None: "no baseline"}[p.same_exact]
                if p.same_exact is False and p.same_normalised:
                    mark = "same (normalised)"
            b, c = p.side(p.baseline), p.side(p.candidate)
            out.write(f"  {p.of} node {p.node}: {mark}; tools {'agree' if p.tools_agree else 'differ' if p.tools_agree is False else '-'}; "
                      f"tokens {_fmt(b['input_tokens'])}+{_fmt(b['output_tokens'])} -> {_fmt(c['input_tokens'])}+"
                      f"{_fmt(c['output_tokens'])}; latency_ms {_fmt(b['latency_ms'])} -> {_fmt(c['latency_ms'])}"
                      + (f"; {p.error}" if p.error else "") + "\n")
        out.write("summary\n")
        for k, v in summary.items():
            out.write(f"  {k}: {_fmt(v)}\n")
        for g in gates:
            out.write(f"gate {g.gate}: {'FAILED' if g.failed else 'passed'} ({g.metric} = {_fmt(g.value)})\n")
    return EXIT_FAILED if any(g.failed for g in gates) else EXIT_OK


def _list(args: argparse.Namespace, out: TextIO) -> int:
    with open_tapes(args) as tapes:
        rows = tapes.experiments()
    if args.json:
        out.write(json.dumps(rows, ensure_ascii=False) + "\n")
        return EXIT_OK
    if not rows:
        out.write("no experiments\n")
    for r in rows:
        when = dt.datetime.fromtimestamp(r["last_ns"] / 1e9, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
        out.write(f"{r['name']}  {r['kind']}  models {','.join(r['models'])}  runs {r['runs']}  "
                  f"originals {r['originals']}  last {when}\n")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Dispatch ``experiment run|compare|list``."""
    verb = {"run": _run, "compare": _compare, "list": _list}[args.experiment_command]
    with reported(*_errors()):
        return verb(args, sys.stdout)
