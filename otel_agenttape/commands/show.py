"""``agenttape show``: a run's ordered step stream (``Tapes.rebuild``).

A RUN is ``RUN_ID@TRACE_ID`` (as ``agenttape runs`` lists it), a trace id (its root run) or a bare run
id; a bare id that names runs in several traces is refused with the candidates (exit 2), never merged.
"""

from __future__ import annotations

import argparse
from typing import Any

from otel_agenttape.commands.errors import EXIT_OK
from otel_agenttape.commands.output import short
from otel_agenttape.commands.sources import read
from otel_agenttape.codec.jsontext import dump_json
from otel_agenttape.pricing import format_usd
from otel_agenttape.tape.model import Run


def _with_cost(tapes: Any, run: Run) -> tuple[Run, dict[str, Any]]:
    from otel_agenttape.tape.read.cost import run_cost

    return run, run_cost(run, tapes.prices)


def _cost_line(cost: dict[str, Any]) -> str:
    from otel_agenttape.pricing import Cost

    return Cost(usd=cost["usd"] if cost["priced_calls"] else None, priced_calls=cost["priced_calls"],
                unpriced_calls=cost["unpriced_calls"]).text()


def _print_steps(run: Run, cost: dict[str, Any], indent: str = "") -> None:
    head = (f"{indent}run {run.ref}  agent={run.agent}  source={run.source}  status={run.status}"
            f"  nodes={len(run.nodes)}  cost={_cost_line(cost)}")
    call_usd = {c["span_id"]: c["usd"] for c in cost["calls"]}
    if run.truncated:
        head += f"  TRUNCATED({len(run.truncated)})"
    if run.erased:
        head += f"  ERASED({len(run.erased)})"
    print(head)
    for step in run.steps:
        p = step.payload
        if step.kind == "input":
            for m in p["messages"]:
                print(f"{indent}  [{step.index:>3}] input      {m['role']}: {short(m['content'])}")
        elif step.kind in ("text", "reasoning"):
            print(f"{indent}  [{step.index:>3}] {step.kind:<10} {short(p.get('text'))}")
        elif step.kind in ("tool-start", "tool-call"):
            print(f"{indent}  [{step.index:>3}] {step.kind:<10} {p.get('name')}({short(p.get('arguments'))})")
        elif step.kind == "tool-result":
            shown = f"ERROR {p['error']}" if p.get("error") else short(p.get("result"))
            print(f"{indent}  [{step.index:>3}] tool-result {p.get('name')} -> {shown}")
        elif step.kind == "model-start":
            print(f"{indent}  [{step.index:>3}] model      {p.get('model')}")
        elif step.kind == "model-end":
            usd = call_usd.get(step.span_id or "")
            print(f"{indent}  [{step.index:>3}] model-end  usage={short(p.get('usage'))}"
                  f" finish={','.join(p.get('finish_reasons') or [])} cost={format_usd(usd)}")
        elif step.kind == "terminal":
            extra = f" ({p['message']})" if p.get("message") else ""
            print(f"{indent}  [{step.index:>3}] terminal   {p.get('status')}{extra}")
        else:
            print(f"{indent}  [{step.index:>3}] {step.kind:<10} {short(p)}")


def run(args: argparse.Namespace) -> int:
    """Print a run's ordered step stream (``--json``: the steps as JSON)."""
    rebuilt, cost = read(args, lambda t: _with_cost(t, t.rebuild(args.run)))
    if args.json:
        print(dump_json({"run_id": rebuilt.run_id, "ref": rebuilt.ref, "status": rebuilt.status,
                         "cost": cost, "steps": [s.to_json() for s in rebuilt.steps]}))
    else:
        _print_steps(rebuilt, cost)
    return EXIT_OK
