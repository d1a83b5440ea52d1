"""``agenttape verify-proof FILE --key PUB``: a proof file checked offline (``integrity.proof.verify_proof``)."""

from __future__ import annotations

import argparse

import orjson

from otel_agenttape.commands.errors import EXIT_FAILED, EXIT_OK, CliError
from otel_agenttape.commands.keys import verifiers


def run(args: argparse.Namespace) -> int:
    """Check a proof file against trusted public keys: exit 0 (valid) or 1 (invalid)."""
    from otel_agenttape.integrity.proof import ProofInvalid, verify_proof

    keys = verifiers(args.key)
    if not keys:
        raise CliError("verify-proof needs --key (the signer's public key)")
    try:
        with open(args.file, "rb") as fh:
            doc = orjson.loads(fh.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise CliError(f"cannot read proof {args.file}: {exc}") from None
    try:
        res = verify_proof(doc, keys)
    except ProofInvalid as exc:
        if args.json:
            print(orjson.dumps({"valid": False, "reason": str(exc)}).decode())
        else:
            print(f"INVALID proof: {exc}")
        return EXIT_FAILED
    if args.json:
        print(orjson.dumps({"valid": True, "chain_id": res.chain_id, "epoch": res.epoch, "index": res.index,
                            "tree_size": res.tree_size, "span_id": res.span_id,
                            "signed_by": list(res.signed_by)}).decode())
    else:
        print(f"ok: span {res.span_id} is entry {res.index} of {res.tree_size} in tape {res.chain_id}, "
              f"signed by {', '.join(res.signed_by)}")
    return EXIT_OK
