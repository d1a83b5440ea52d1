"""The `agenttape show | replay | diff | dataset` commands, over the read model (``Tapes``).

A RUN is ``RUN_ID@TRACE_ID`` (as ``agenttape runs`` lists it), a trace id (its root run) or a bare run
id; a bare id that names runs in several traces is refused with the candidates (exit 2), never merged.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from otel_agenttape.cli import CliError
from otel_agenttape.commands.sources import open_tapes
from otel_agenttape.tape.content import dump_json
from otel_agenttape.tape.model import Run
from otel_agenttape.tape.refs import AmbiguousRunError, RunNotFound

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
T = TypeVar("T")


def _read(args: argparse.Namespace, fn: Callable[[Any], T]) -> T:
    """Run ``fn(tapes)``; an unknown or ambiguous run is a one-line error (exit 2)."""
    tapes = open_tapes(args)
    try:
        return fn(tapes)
    except AmbiguousRunError as exc:
        raise CliError(f"{exc}\n" + "\n".join(f"  {c}" for c in exc.candidates)) from None
    except RunNotFound as exc:
        raise CliError(str(exc)) from None
    finally:
        tapes.close()


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else dump_json(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _print_steps(run: Run, indent: str = "") -> None:
    head = (f"{indent}run {run.ref}  agent={run.agent}  source={run.source}  status={run.status}"
            f"  nodes={len(run.nodes)}")
    if run.truncated:
        head += f"  TRUNCATED({len(run.truncated)})"
    print(head)
    for step in run.steps:
        p = step.payload
        if step.kind == "input":
            for m in p["messages"]:
                print(f"{indent}  [{step.index:>3}] input      {m['role']}: {_short(m['content'])}")
        elif step.kind in ("text", "reasoning"):
            print(f"{indent}  [{step.index:>3}] {step.kind:<10} {_short(p.get('text'))}")
        elif step.kind in ("tool-start", "tool-call"):
            print(f"{indent}  [{step.index:>3}] {step.kind:<10} {p.get('name')}({_short(p.get('arguments'))})")
        elif step.kind == "tool-result":
            shown = f"ERROR {p['error']}" if p.get("error") else _short(p.get("result"))
            print(f"{indent}  [{step.index:>3}] tool-result {p.get('name')} -> {shown}")
        elif step.kind == "model-start":
            print(f"{indent}  [{step.index:>3}] model      {p.get('model')}")
        elif step.kind == "model-end":
            print(f"{indent}  [{step.index:>3}] model-end  usage={_short(p.get('usage'))}"
                  f" finish={','.join(p.get('finish_reasons') or [])}")
        elif step.kind == "terminal":
            extra = f" ({p['message']})" if p.get("message") else ""
            print(f"{indent}  [{step.index:>3}] terminal   {p.get('status')}{extra}")
        else:
            print(f"{indent}  [{step.index:>3}] {step.kind:<10} {_short(p)}")


def cmd_show(args: argparse.Namespace) -> int:
    """Print a run's ordered step stream (``--json``: the steps as JSON)."""
    run = _read(args, lambda t: t.rebuild(args.run))
    if args.json:
        print(dump_json({"run_id": run.run_id, "ref": run.ref, "status": run.status,
                         "steps": [s.to_json() for s in run.steps]}))
    else:
        _print_steps(run)
    return EXIT_OK


def _print_run(doc: dict[str, Any], indent: str = "") -> None:
    print(f"{indent}run {doc['ref']}  agent={doc['agent']}  status={doc['status']}"
          + (f"  parent={doc['parent_run_id']}" if doc.get("parent_run_id") else ""))
    for m in doc["input"]:
        print(f"{indent}  {m['role']}: {_short(m['content'])}")
    for t in doc["tools"]:
        shown = f"ERROR {t['error']}" if t.get("error") else _short(t.get("result"))
        print(f"{indent}  tool {t['name']}({_short(t.get('arguments'))}) -> {shown}")
    print(f"{indent}  output: {_short(doc['output'], 400)}")
    for child in doc["children"]:
        _print_run(child, indent + "    ")


def cmd_replay(args: argparse.Namespace) -> int:
    """Rebuild a run (or with --tree the run and every child run) from the store, no model call."""
    doc = _read(args, lambda t: t.replay(args.run, tree=args.tree))
    if args.json:
        print(dump_json(doc))
    else:
        _print_run(doc)
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """Show the first node where two runs diverge (exit 1), or say they match (exit 0)."""
    doc = _read(args, lambda t: t.diff(args.run_a, args.run_b))
    d = doc["first_divergence"]
    if args.json:
        print(dump_json(doc))
    elif d is None:
        print(f"runs {doc['ref_a']} and {doc['ref_b']} match ({doc['nodes_a']} nodes)")
    else:
        print(f"runs diverge at node {d['index']} ({', '.join(d['fields'])})")
        print(f"--- {doc['ref_a']}")
        print(json.dumps(d["a"], indent=2, ensure_ascii=False, default=str))
        print(f"+++ {doc['ref_b']}")
        print(json.dumps(d["b"], indent=2, ensure_ascii=False, default=str))
    return EXIT_FAILED if d is not None else EXIT_OK


def cmd_dataset(args: argparse.Namespace) -> int:
    """Export completed runs as OpenAI chat fine-tuning JSONL; skipped runs are counted by reason."""
    from otel_agenttape.tape.dataset import parse_since

    try:
        since = parse_since(args.since) if args.since else None
    except ValueError:
        raise CliError(f"--since: not an ISO date/time or nanoseconds since the epoch: {args.since}") from None

    def export(tapes: Any) -> Any:
        try:
            out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc}") from None
        try:
            return tapes.dataset(out, agent=args.agent, model=args.model, since=since)
        except OSError as exc:
            raise CliError(f"cannot write {args.out}: {exc}") from None
        finally:
            if out is not sys.stdout:
                out.close()

    result = _read(args, export)
    print(result.summary(), file=sys.stderr if args.out == "-" else sys.stdout)
    if args.json:
        print(json.dumps({"written": result.written, "skipped": dict(result.skipped)}),
              file=sys.stderr if args.out == "-" else sys.stdout)
    return EXIT_OK
