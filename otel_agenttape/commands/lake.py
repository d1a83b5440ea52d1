"""``agenttape lake compact``, ``lake retain``, ``lake status`` and ``lake migrate``: one verb, four actions.

Thin shells over ``otel_agenttape.store.lake.maintain`` (a folder or S3 lake) and
``otel_agenttape.store.lake.iceberg_maintain`` (an Iceberg lake, ``iceberg+...``); each returns an exit code.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from otel_agenttape.commands.errors import CliError, reported

_AGE = re.compile(r"^\s*(\d+)\s*d?\s*$")


def parse_days(text: str) -> int:
    """``30d`` or ``30``: whole UTC days."""
    m = _AGE.match(text or "")
    if not m:
        raise CliError(f"--older-than {text!r}: give whole days, like 30d")
    return int(m.group(1))


def _call(fn: Any, *a: Any, **kw: Any) -> Any:
    from otel_agenttape.store.lake.fs import LakeError

    with reported(LakeError, OSError, ValueError, RuntimeError):
        return fn(*a, **kw)


def _report(args: Any, out: dict[str, Any], text: str) -> int:
    """Print the action's result: its JSON with ``--json``, else the one line ``text``."""
    print(json.dumps(out) if args.json else text)
    return 0


def _iceberg(lake: str) -> bool:
    from otel_agenttape.store.lake.iceberg_catalog import is_iceberg_uri

    return is_iceberg_uri(lake)


def cmd_compact(args: Any) -> int:
    if _iceberg(args.lake):
        from otel_agenttape.store.lake.iceberg_maintain import compact as ice_compact

        out = _call(ice_compact, args.lake, target_bytes=int(args.target_mb * 1024 * 1024), grace_seconds=args.grace)
        return _report(args, out, f"compacted {out['merged_files']} files into {out['written_files']} ({out['rows']} "
                                  f"rows); deleted {out['deleted']} files and expired {out['expired_snapshots']} "
                                  "snapshots past the grace period")
    from otel_agenttape.store.lake.maintain import compact

    out = _call(compact, args.lake, target_bytes=int(args.target_mb * 1024 * 1024), grace_seconds=args.grace)
    return _report(args, out, f"compacted {out['merged_files']} files into {out['written_files']} ({out['rows']} "
                              f"rows); deleted {out['deleted']} files past the grace period; snapshot {out['generation']}")


def cmd_migrate(args: Any) -> int:
    from otel_agenttape.store.lake.iceberg_maintain import migrate

    if not _iceberg(args.target):
        raise CliError(f"{args.target}: migrate into an Iceberg lake (iceberg+sql:///PATH.db#ns, iceberg+postgresql://...)")
    out = _call(migrate, args.lake, args.target)
    return _report(args, out, f"migrated {out['files']} files ({out['rows']} rows) from {out['from']} into "
                              f"{out['written_files']} Iceberg data files in {out['snapshots']} snapshots; "
                              f"{out['skipped']} files were there already")


def cmd_retain(args: Any) -> int:
    if _iceberg(args.lake):
        from otel_agenttape.store.lake.iceberg_maintain import retain as ice_retain

        out = _call(ice_retain, args.lake, parse_days(args.older_than), grace_seconds=args.grace)
    else:
        from otel_agenttape.store.lake.maintain import retain

        out = _call(retain, args.lake, parse_days(args.older_than), grace_seconds=args.grace)
    return _report(args, out, f"removed {out['removed_files']} files ({out['rows']} rows) dated before {out['before']}; "
                              f"recorded {out['chains']} tape ranges as removed by retention; deleted {out['deleted']} files")


def cmd_status(args: Any) -> int:
    if _iceberg(args.lake):
        from otel_agenttape.store.lake.iceberg_maintain import status as ice_status

        out = _call(ice_status, args.lake)
        if args.json:
            print(json.dumps(out))
            return 0
        print(f"lake {out['lake']}")
        for rid, seq in sorted(out["receivers"].items()):
            print(f"  receiver {rid}: {seq} batches")
        for t, v in sorted(out["tables"].items()):
            print(f"  {t:12} {v['files']:>6} files {v['rows']:>12} rows {v['bytes']:>14} bytes {v['snapshots']:>5} snapshots")
        return 0
    from otel_agenttape.store.lake.maintain import status

    out = _call(status, args.lake)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"lake {out['lake']}: snapshot {out['generation']}, {out['uncovered_entries']} entries since")
    for rid, seq in sorted(out["receivers"].items()):
        print(f"  receiver {rid}: {seq} batches")
    for t, v in sorted(out["tables"].items()):
        print(f"  {t:12} {v['files']:>6} files {v['rows']:>12} rows {v['bytes']:>14} bytes")
    for r in out["retention"]:
        print(f"  retention {r['at']}: before {r['before']}, {r['files']} files, {r['rows']} rows")
    return 0


def run(args: argparse.Namespace) -> int:
    """Maintain a lake: compact small files, drop old partitions, show what it lists, migrate it to Iceberg."""
    return int({"compact": cmd_compact, "retain": cmd_retain, "status": cmd_status,
                "migrate": cmd_migrate}[args.lake_command](args))
