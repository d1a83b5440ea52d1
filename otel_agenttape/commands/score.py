"""``agenttape score``: score a run from any process, minutes after it ran (``Tape.score``).

The score is sealed in a small tape of its own that names the run, and leaves through the exporter the
agent's settings configure (``AGENTTAPE_ENDPOINT`` or the ``OTEL_EXPORTER_OTLP_*`` variables, headers,
signing key): when the receiver does not answer it waits in the outbox (``--outbox`` /
``AGENTTAPE_OUTBOX``), which this command, the next one or any agent with the same outbox re-sends.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK, CliError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("score", help="score a recorded run (or one node) from any process: sealed, outboxed")
    p.add_argument("run", metavar="RUN", help="RUN_ID@TRACE_ID, a run id, or a model response id")
    p.add_argument("name", metavar="NAME", help="what is scored, e.g. helpfulness, correctness, thumbs")
    p.add_argument("--value", type=float, default=None, help="the score as a number")
    p.add_argument("--label", default=None, help="the score as a label (pass, fail, up, down, ...)")
    p.add_argument("--explanation", default=None, metavar="TEXT", help="why (a comment, a judge's reasoning)")
    p.add_argument("--source", default="human", metavar="WHO",
                   help="human (default), llm, code, or an evaluator's name (NAME@VERSION)")
    p.add_argument("--version", default=None, help="the evaluator's version")
    p.add_argument("--span", default=None, metavar="SPAN_ID", help="score this node of the run (with RUN_ID@TRACE_ID)")
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help="the receiver (env AGENTTAPE_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT; default localhost:4318)")
    p.add_argument("--protocol", default=None, choices=["http/protobuf", "grpc"], help="default http/protobuf")
    p.add_argument("--outbox", default=None, metavar="DIR",
                   help="keep the score here while the receiver is down (env AGENTTAPE_OUTBOX)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="of one export request")
    p.add_argument("--wait", type=float, default=5.0, metavar="SECONDS",
                   help="how long to try to deliver (this score and the outbox's backlog) before leaving it "
                        "in the outbox (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print what was recorded as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Record one score; exit 0 once it is delivered or kept in the outbox, 1 when it is neither."""
    from otel_agenttape import semconv as sc
    from otel_agenttape.capture.scores import ScoreError
    from otel_agenttape.capture.settings import SettingsError, resolve
    from otel_agenttape.capture.setup import setup

    if args.value is None and args.label is None:
        raise CliError("give --value V, --label L or both")
    try:
        settings = resolve(endpoint=args.endpoint, protocol=args.protocol, outbox=args.outbox,
                           timeout=args.timeout, service_name=None)
        kwargs = settings.setup_kwargs()
        kwargs["queue_options"] = {"shutdown_timeout_millis": max(0.5, args.wait) * 1000}
        tape = setup(**kwargs)
    except (SettingsError, ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    try:
        try:
            span = tape.score(args.run, args.name, args.value, args.label, args.explanation, source=args.source,
                              version=args.version, span_id=args.span)
        except ScoreError as exc:
            raise CliError(str(exc)) from None
        tape.wait_delivered(max(0.0, args.wait))
    finally:
        tape.shutdown()
    stats = tape.stats()
    box = tape.outbox
    pending = box.counts().get("outbox_spans_pending", 0) if box is not None else 0
    failed = stats.get("spans_export_failed", 0) + stats.get("spans_dropped_shutdown", 0) + stats.get(
        "spans_refused", 0) + stats.get("outbox_dropped_full", 0)
    kept = bool(box is not None and pending)  # spans may pass through the outbox behind its backlog
    state = "kept in the outbox" if kept else "not delivered" if failed else "delivered"
    attrs = dict(span.events[0].attributes) if span.events else {}
    doc = {"of": args.run, "name": attrs.get(sc.GEN_AI_EVALUATION_NAME), "value": attrs.get(
        sc.GEN_AI_EVALUATION_SCORE_VALUE), "label": attrs.get(sc.GEN_AI_EVALUATION_SCORE_LABEL),
        "source": attrs.get(sc.SCORE_SOURCE), "version": attrs.get(sc.SCORE_VERSION),
        "score_id": attrs.get(sc.SCORE_ID), "tape": f"{span.get_span_context().trace_id:032x}", "state": state,
        "outbox": str(box.path) if box is not None else None, "outbox_spans_pending": pending}
    if args.json:
        print(json.dumps(doc))
    else:
        shown = " ".join(x for x in (f"value={doc['value']:g}" if doc["value"] is not None else "",
                                     f"label={doc['label']}" if doc["label"] is not None else "") if x)
        print(f"scored {args.run} {doc['name']} {shown} by {doc['source']}: {state}")
        if kept:
            print(f"the outbox {box.path} holds {pending} span(s): re-sent by the next process with this outbox, "
                  f"or load it with `agenttape ingest {box.path}`")
    if state == "not delivered":
        print("agenttape: the receiver did not take the score and no outbox is set (--outbox DIR or "
              "AGENTTAPE_OUTBOX keeps it until the receiver is back)", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
