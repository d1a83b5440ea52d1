"""``agenttape erase``: a session's, run's or trace's content (or all before a time) erased, the tapes still verifying.

A thin shell over ``Tapes.erase``: the values and their salts leave the DuckDB store, an erasure record
(sealed and signed, naming spans and keys, never content) is written, and the file is rewritten so no
copy remains. ``--dry-run`` prints what would be erased and changes nothing.
"""

from __future__ import annotations

import argparse
import sys

import orjson

from otel_agenttape.commands.errors import EXIT_OK, CliError
from otel_agenttape.commands.sources import read, store_errors


def run(args: argparse.Namespace) -> int:
    if not (args.reason or "").strip():
        raise CliError("--reason is required (it is written into the erasure record)")

    def erase(tapes) -> dict:
        try:
            return tapes.erase(session=args.session, run=args.run, trace=args.trace, before=args.before,
                               where=args.where,
                               reason=args.reason, signing_key=args.signing_key, by=args.by, dry_run=args.dry_run,
                               parquet=args.copy_parquet, lakes=args.copy_lake, wal=args.copy_wal,
                               outbox=args.copy_outbox)
        except store_errors() as exc:
            raise CliError(str(exc)) from None

    result = read(args, erase)
    if not result["dry_run"] and result["erasure_id"]:
        from otel_agenttape.receiver.spool import remove_stale

        # a killed receiver's hand-off files (request bodies, rows) in shared memory: transient, removed
        result["spools_removed"] = len(remove_stale())
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
        return EXIT_OK
    verb = "would erase" if result["dry_run"] else "erased"
    print(f"{verb} {result['values']} values in {result['spans']} sealed spans"
          + (f" (erasure {result['erasure_id']})" if result["erasure_id"] else "")
          + (f", keys: {', '.join(result['keys'])}" if result["keys"] else ""))
    if result["unsealed_values"]:
        print(f"  {verb} {result['unsealed_values']} values in {result['unsealed_spans']} unsealed spans")
    if result["skipped_v1_spans"]:
        print(f"  left {result['skipped_v1_spans']} sealed v1 spans (their leaves hold the content itself: "
              "erasing it would break their tape)")
    for c in result["copies"]:
        done = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in c.items()
                         if k.endswith(("_rewritten", "_deleted")))
        print(f"  {c['kind']} {c['path']}: {verb} {c['values'] + c['unsealed_values']} values in {c['spans']} "
              "sealed spans" + (f" ({done})" if done else ""))
    if "wal" in result:
        w = result["wal"]
        print(f"  receiver WAL: {w['segments_deleted']} closed segments deleted once stored, "
              f"{w['segments_rewritten']} rewritten; {result.get('spool_files_removed', 0)} kept spool files removed")
    if "writes_paused_seconds" in result:
        print(f"  erased by the running receiver: its writes waited {result['writes_paused_seconds']:.2f} s "
              "(requests were acknowledged meanwhile and stored after)")
    if not result["dry_run"] and result["erasure_id"]:
        print(f"  store rewritten in {result['seconds']:.2f} s: no copy left in the file or its WAL"
              + (f"; removed {result['spools_removed']} spool folders of stopped receivers"
                 if result["spools_removed"] else ""))
    return EXIT_OK
