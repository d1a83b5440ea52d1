"""``agenttape demo``: record the scripted multi-agent run (``otel_agenttape.demo.record_demo``), then show
what the store holds: the runs, the rebuilt tree and the tape's verification."""

from __future__ import annotations

import argparse
import json
from typing import Any

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK, CliError


def _print_tree(run: Any, indent: str = "  ") -> None:
    tools = ", ".join(f"{t.name}{' (error)' if t.error else ''}" for t in run.tools)
    print(f"{indent}{run.agent} [{run.status}] {run.run_id}" + (f"  tools: {tools}" if tools else ""))
    out = str(run.output or "")
    print(f"{indent}  -> {out[:110]}{'...' if len(out) > 110 else ''}")
    for child in run.children:
        _print_tree(child, indent + "    ")


def run(args: argparse.Namespace) -> int:
    """Record a scripted multi-agent run through a local receiver, then show, replay and verify it."""
    from otel_agenttape.demo import DemoError, record_demo

    if args.json and args.serve:
        raise CliError("--serve prints the console's URL as text: use it without --json")
    try:
        result = record_demo(args.db)
    except DemoError as exc:
        raise CliError(str(exc)) from None
    valid = result["verified"]
    if args.json:
        print(json.dumps({
            "db": args.db, "run_id": result["run_id"], "children": result["children"],
            "outputs": result["outputs"], "spans": result["spans"], "runs": result["runs"],
            "verified": valid, "seconds": result["seconds"],
            "tree": result["tree"].root.to_json(children=True),
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
    _print_tree(result["tree"].root)
    print()
    for r in result["tapes"]:
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
