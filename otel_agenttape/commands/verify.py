"""``agenttape verify``: every sealed tape checked (``tape.verification.verify_store``); exit 1 on a failure."""

from __future__ import annotations

import argparse
import os
import sys

import orjson

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK, CliError
from otel_agenttape.commands.keys import verifiers
from otel_agenttape.commands.sources import open_args


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every tape verifies, 1 otherwise (2 for an unknown ``--run``)."""
    from otel_agenttape.tape.verification import verify_store

    keys = verifiers(args.key)
    for path in args.checkpoints or ():
        if not os.path.exists(path):
            raise CliError(f"no checkpoint file {path}")
    tapes = open_args(args)
    try:
        reports = verify_store(tapes.reader, run=args.run, verifiers=keys, checkpoint_files=args.checkpoints or ())
        if not reports and args.run is not None and not tapes.has_spans(args.run, tape=True):
            raise CliError(f"run not found: {args.run}")
        lakes = getattr(tapes.reader, "lakes", None)  # a lake: every listed file there, as published
        files = lakes.check_files() if lakes is not None else []
    finally:
        tapes.close()
    ok = bool(reports) and all(r.valid for r in reports) and not files
    if args.json:
        doc = {"valid": ok, "chains": [r.to_json() for r in reports]}
        if lakes is not None:
            doc["lake_files"] = {"checked": lakes.files(), "problems": files}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return EXIT_OK if ok else EXIT_FAILED
    if not reports:
        print("no sealed tapes found" + (f" for run {args.run}" if args.run else ""))
        for f in files:  # a lake's damaged files are a finding with or without sealed tapes
            print(f"FAIL  lake file {f['file']}: {f['problem']}")
        return EXIT_FAILED
    for r in reports:
        epoch = f" epoch {r.epoch}" if r.epoch else ""
        if r.trace_id:  # the same tape id and epoch opened in several traces (integrity.md section 2)
            epoch += f" (trace {r.trace_id})"
        signed = f", signed up to {r.signed_size}" if r.key_pinned else ""
        if r.valid:
            print(f"ok    {r.chain_id}{epoch}: {r.length} entries{signed}")
        else:
            print(f"FAIL  {r.chain_id}{epoch}: {r.length} entries, first broken index {r.first_broken_index}: {r.reason}")
            for issue in r.issues[1:6]:
                print(f"        also at {issue.index}: {issue.reason}")
        if r.restored_from:
            print(f"        restored epoch; previous checkpoint: {r.restored_from}")
        if r.erased_values or r.erased_spans:
            names = ", ".join(f"erasure {e['id']} on {e['date']}" for e in r.erasures) or "no valid erasure record"
            print(f"        {r.erased_spans} spans, {r.erased_values} values erased by {names}")
        if r.removed_by_retention:
            print(f"        {r.removed_by_retention} earlier entries removed by retention (recorded in the lake)")
    for f in files:
        print(f"FAIL  lake file {f['file']}: {f['problem']}")
    if not keys:
        print("note: no --key given: checkpoint signatures were not checked against a trusted key")
    return EXIT_OK if ok else EXIT_FAILED
