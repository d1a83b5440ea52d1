"""``agenttape retain``: the lake's retention rule on a DuckDB store (``Tapes.retain``).

Spans dated before UTC today minus ``--older-than`` days go with their events, links and old log
records, recorded so ``verify`` reports them as removed by retention; ``--content-only`` erases their
content instead (a signed erasure record, as ``agenttape erase``). Meant for a scheduler (cron, a
Kubernetes CronJob) as ``lake retain`` is; the output line is the same shape.
"""

from __future__ import annotations

import argparse

import orjson

from otel_agenttape.commands.errors import EXIT_OK, CliError
from otel_agenttape.commands.lake import parse_days
from otel_agenttape.commands.sources import read, store_errors


def run(args: argparse.Namespace) -> int:
    if not (args.reason or "").strip():
        raise CliError("--reason is required (it is written into the record)")
    days = parse_days(args.older_than)

    def retain(tapes) -> dict:
        try:
            return tapes.retain(older_than_days=days, reason=args.reason, content_only=args.content_only,
                                signing_key=args.signing_key, by=args.by, dry_run=args.dry_run)
        except store_errors() as exc:
            raise CliError(str(exc)) from None

    out = read(args, retain)
    if args.json:
        print(orjson.dumps(out).decode())
        return EXIT_OK
    verb = bool(out["dry_run"])
    if out["content_only"]:
        print(f"{'would erase' if verb else 'erased'} {out['values']} values in {out['spans']} sealed spans dated before "
              f"{out['before']}" + (f" (erasure {out['erasure_id']})" if out.get("erasure_id") else ""))
    else:
        print(f"{'would remove' if verb else 'removed'} {out['spans']} spans and {out['log_records']} log records "
              f"dated before {out['before']}; {'would record' if verb else 'recorded'} {out['chains']} tape ranges "
              "as removed by retention")
    if "writes_paused_seconds" in out:
        print(f"  done by the running receiver: its writes waited {out['writes_paused_seconds']:.2f} s "
              "(requests were acknowledged meanwhile and stored after)")
    return EXIT_OK
