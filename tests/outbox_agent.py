"""An agent process for the outbox fault tests and bench/faults.py.

    python outbox_agent.py ENDPOINT PROTOCOL OUTBOX RUNS [--calls N] [--pause S] [--no-shutdown]
                           [--hold] [--wait-drained S] [--max-bytes B] [--prefix P]

Records RUNS runs of N model calls each (sealed), printing ``run I`` after each; ``--hold`` then
prints ``held`` and waits for a line on stdin before shutting down; at the end it prints one JSON line
of ``tape.stats()``. ``--wait-drained S`` waits up to S seconds for the outbox to be empty first.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import otel_agenttape


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("endpoint")
    p.add_argument("protocol")
    p.add_argument("outbox")
    p.add_argument("runs", type=int)
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--prefix", default="run")
    p.add_argument("--hold", action="store_true")
    p.add_argument("--no-shutdown", action="store_true")
    p.add_argument("--wait-drained", type=float, default=0.0)
    p.add_argument("--max-bytes", type=int, default=None)
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--debug", action="store_true", help="log the outbox's re-send attempts on stderr")
    args = p.parse_args()
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, format="%(relativeCreated)d %(name)s %(message)s")
        logging.getLogger("otel_agenttape.capture").setLevel(logging.DEBUG)
    opts = {"max_bytes": args.max_bytes} if args.max_bytes else None
    tape = otel_agenttape.setup(args.endpoint, args.protocol, outbox=args.outbox, outbox_options=opts,
                                timeout=args.timeout, insecure=True if args.protocol == "grpc" else None,
                                service_name="outbox-agent", queue_options={"max_export_batch_size": args.batch})
    for i in range(args.runs):
        with tape.run(agent="worker", run_id=f"{args.prefix}-{i}") as run:
            for c in range(args.calls):
                with run.model_call("m", [{"role": "user", "content": f"question {i}.{c} " + "x" * 200}]) as call:
                    call.finish(text=f"answer {i}.{c}")
            run.set_output("done")
        print(f"run {i}", flush=True)
        if args.pause:
            time.sleep(args.pause)
    if args.hold:  # once every span ended so far is exported or in the outbox
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            s = tape.stats()
            settled = (s["spans_exported"] + s["spans_to_outbox"] + s["spans_export_failed"]
                       + s["spans_dropped_too_large"])
            if s["queue_length"] == 0 and settled >= s["spans_queued"] and not tape.outbox._spill:
                break
            time.sleep(0.05)
        print("held " + json.dumps(tape.stats()), flush=True)
        sys.stdin.readline()
    if args.wait_drained and tape.outbox is not None:
        tape.wait_delivered(args.wait_drained)
    if not args.no_shutdown:
        tape.shutdown()
    print(json.dumps(tape.stats()), flush=True)


if __name__ == "__main__":
    main()
