"""The `agenttape show | replay | diff | dataset` commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from otel_agenttape.cli import CliError
from otel_agenttape.commands.sources import open_args
from otel_agenttape.tape.content import dump_json
from otel_agenttape.tape.model import Run
from otel_agenttape.tape.rebuild import RunNotFound, reconstruct, reconstruct_tree

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _open(args: argparse.Namespace) -> Any:
    return open_args(args)


def _load(reader: Any, run_id: str, tree: bool = False) -> Any:
    try:
        return reconstruct_tree(reader, run_id) if tree else reconstruct(reader, run_id)
    except RunNotFound as exc:
        raise CliError(str(exc)) from None


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else dump_json(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _print_steps(run: Run, indent: str = "") -> None:
    head = f"{indent}run {run.run_id}  agent={run.agent}  status={run.status}  nodes={len(run.nodes)}"
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
    reader = _open(args)
    try:
        run = _load(reader, args.run)
    finally:
        reader.close()
    if args.json:
        print(dump_json({"run_id": run.run_id, "status": run.status, "steps": [s.to_json() for s in run.steps]}))
    else:
        _print_steps(run)
    return EXIT_OK


def _print_run(run: Run, indent: str = "") -> None:
    print(f"{indent}run {run.run_id}  agent={run.agent}  status={run.status}"
          + (f"  parent={run.parent_run_id}" if run.parent_run_id else ""))
    for m in run.input:
        print(f"{indent}  {m.role}: {_short(m.content())}")
    for t in run.tools:
        shown = f"ERROR {t.error}" if t.error else _short(t.result)
        print(f"{indent}  tool {t.name}({_short(t.arguments)}) -> {shown}")
    print(f"{indent}  output: {_short(run.output, 400)}")
    for child in run.children:
        _print_run(child, indent + "    ")


def cmd_replay(args: argparse.Namespace) -> int:
    """Rebuild a run (or with --tree the run and every child run) from the store, no model call."""
    reader = _open(args)
    try:
        loaded = _load(reader, args.run, tree=args.tree)
    finally:
        reader.close()
    run = loaded.root if args.tree else loaded
    if args.json:
        print(dump_json(run.to_json(children=args.tree)))
    else:
        _print_run(run)
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    """Show the first node where two runs diverge (exit 1), or say they match (exit 0)."""
    from otel_agenttape.tape.diff import diff_runs

    reader = _open(args)
    try:
        a = _load(reader, args.run_a)
        b = _load(reader, args.run_b)
    finally:
        reader.close()
    d = diff_runs(a, b)
    if args.json:
        print(dump_json({"run_a": a.run_id, "run_b": b.run_id, "diverged": d is not None,
                         "first_divergence": d.to_json() if d else None}))
    elif d is None:
        print(f"runs {a.run_id} and {b.run_id} match ({len(a.nodes)} nodes)")
    else:
        print(f"runs diverge at node {d.index} ({', '.join(d.fields)})")
        print(f"--- {a.run_id}")
        print(json.dumps(d.a, indent=2, ensure_ascii=False, default=str))
        print(f"+++ {b.run_id}")
        print(json.dumps(d.b, indent=2, ensure_ascii=False, default=str))
    return EXIT_FAILED if d is not None else EXIT_OK


def cmd_dataset(args: argparse.Namespace) -> int:
    """Export completed runs as OpenAI chat fine-tuning JSONL; skipped runs are counted by reason."""
    from otel_agenttape.tape.dataset import export_dataset, parse_since

    try:
        since = parse_since(args.since) if args.since else None
    except ValueError:
        raise CliError(f"--since: not an ISO date/time or nanoseconds since the epoch: {args.since}") from None
    reader = _open(args)
    try:
        out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")  # noqa: SIM115
        try:
            result = export_dataset(reader, out, agent=args.agent, model=args.model, since_ns=since)
        finally:
            if out is not sys.stdout:
                out.close()
    except OSError as exc:
        raise CliError(f"cannot write {args.out}: {exc}") from None
    finally:
        reader.close()
    print(result.summary(), file=sys.stderr if args.out == "-" else sys.stdout)
    if args.json:
        print(json.dumps({"written": result.written, "skipped": dict(result.skipped)}),
              file=sys.stderr if args.out == "-" else sys.stdout)
    return EXIT_OK
