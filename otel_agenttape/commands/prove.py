"""``agenttape prove SPAN_ID --out FILE``: a self-contained proof that one span is in its signed tape
(``tape.proofs.prove_span``)."""

from __future__ import annotations

import argparse
import sys

import orjson

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK, CliError
from otel_agenttape.commands.keys import verifiers
from otel_agenttape.commands.sources import open_args


def run(args: argparse.Namespace) -> int:
    """Write the proof (leaf, inclusion proof, signed checkpoint) of one span; exit 1 when it cannot be proven."""
    from otel_agenttape.tape.proofs import ProveError, prove_span

    keys = verifiers(args.key)
    tapes = open_args(args)
    try:
        proof = prove_span(tapes.reader, args.span_id, verifiers=keys, checkpoint_files=args.checkpoints or ())
    except ProveError as exc:
        print(f"agenttape: cannot prove: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        tapes.close()
    try:
        with open(args.out, "wb") as fh:
            fh.write(orjson.dumps(proof, option=orjson.OPT_INDENT_2) + b"\n")
    except OSError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote proof of span {proof['span_id']} (seq {proof['index']} of {proof['tree_size']} "
          f"in tape {proof['chain_id']}) to {args.out}")
    return EXIT_OK
