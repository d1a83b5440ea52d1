"""``agenttape replay``: a run (``--tree``: with its child runs) rebuilt from the store with no model call
(``Tapes.replay``)."""

from __future__ import annotations

import argparse
from typing import Any

from otel_agenttape.commands.errors import EXIT_OK
from otel_agenttape.commands.output import short
from otel_agenttape.commands.sources import read
from otel_agenttape.codec.jsontext import dump_json


def _cost(cost: dict[str, Any]) -> str:
    from otel_agenttape.pricing import Cost

    return Cost(usd=cost["usd"] if cost["priced_calls"] else None, priced_calls=cost["priced_calls"],
                unpriced_calls=cost["unpriced_calls"]).text()


def _print_run(doc: dict[str, Any], indent: str = "") -> None:
    cost = f"  cost={_cost(doc['cost'])}" if doc.get("cost") else ""
    if doc.get("children") and doc.get("tree_cost"):
        cost += f"  tree_cost={_cost(doc['tree_cost'])}"
    print(f"{indent}run {doc['ref']}  agent={doc['agent']}  status={doc['status']}"
          + (f"  parent={doc['parent_run_id']}" if doc.get("parent_run_id") else "") + cost)
    for m in doc["input"]:
        print(f"{indent}  {m['role']}: {short(m['content'])}")
    for t in doc["tools"]:
        shown = f"ERROR {t['error']}" if t.get("error") else short(t.get("result"))
        print(f"{indent}  tool {t['name']}({short(t.get('arguments'))}) -> {shown}")
    print(f"{indent}  output: {short(doc['output'], 400)}")
    for child in doc["children"]:
        _print_run(child, indent + "    ")


def run(args: argparse.Namespace) -> int:
    """Rebuild a run (or with --tree the run and every child run) from the store, no model call."""
    doc = read(args, lambda t: t.replay(args.run, tree=args.tree))
    if args.json:
        print(dump_json(doc))
    else:
        _print_run(doc)
    return EXIT_OK
