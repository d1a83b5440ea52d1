"""``agenttape diff``: the first node where two runs diverge (``Tapes.diff``); exit 1 when they do."""

from __future__ import annotations

import argparse
import json

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK
from otel_agenttape.commands.sources import read
from otel_agenttape.codec.jsontext import dump_json


def run(args: argparse.Namespace) -> int:
    """Show the first node where two runs diverge (exit 1), or say they match (exit 0)."""
    doc = read(args, lambda t: t.diff(args.run_a, args.run_b))
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
