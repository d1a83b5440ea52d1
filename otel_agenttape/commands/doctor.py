"""``agenttape doctor``: the checks of ``otel_agenttape.doctor.diagnose``, printed."""

from __future__ import annotations

import argparse
import json

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Check packages, export settings, the store and a running receiver; list every loss counter."""
    from otel_agenttape.doctor import diagnose

    checks = diagnose(args.db)
    if args.json:
        print(json.dumps([{"name": c.name, "ok": c.ok, "status": c.status, "detail": c.detail, "data": c.data}
                          for c in checks],
                         indent=2, default=str))
    else:
        for c in checks:
            print(f"{c.status:<4}  {c.name}: {c.detail}")
        print("Capture counters (spans dropped, exporter errors, cut payloads) live in the agent process: "
              "tape.stats().")
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED
