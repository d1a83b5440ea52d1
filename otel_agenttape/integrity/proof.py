"""Self-contained span proofs: one leaf, its inclusion proof and a signed checkpoint.

The file is JSON (``format: agenttape-proof/v1``) so a single record can go to an auditor without
the rest of the tape. ``verify_proof`` recomputes the leaf hash from the leaf bytes in the file
(never trusting a hash supplied alongside), checks the inclusion proof against the checkpoint's
root, the checkpoint's signature against pinned keys, and that the checkpoint's origin is the tape
the proof names.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from otel_agenttape.integrity.checkpoint import Checkpoint, CheckpointError, origin_for
from otel_agenttape.integrity.merkle import (
    ProofError,
    inclusion_proof,
    leaf_hash,
    verify_inclusion,
)
from otel_agenttape.integrity.note import NoteError, Verifier, open_note

PROOF_FORMAT = "agenttape-proof/v1"


class ProofInvalid(ValueError):
    pass


def build_proof(chain_id: str, epoch: int, index: int, leaves: Sequence[bytes], note: str) -> dict[str, Any]:
    """Proof for entry ``index`` given the tape's first ``size`` leaves and a note signing that size."""
    cp = Checkpoint.parse(note[: note.rfind("\n\n") + 1])
    if cp.size != len(leaves):
        raise ProofInvalid(f"checkpoint size {cp.size} but {len(leaves)} leaves given")
    hashes = [leaf_hash(x) for x in leaves]
    proof = inclusion_proof(hashes, index)
    leaf = leaves[index]
    span = orjson.loads(leaf)
    return {
        "format": PROOF_FORMAT,
        "chain_id": chain_id,
        "epoch": epoch,
        "index": index,
        "tree_size": cp.size,
        "trace_id": span.get("trace_id"),
        "span_id": span.get("span_id"),
        "leaf": leaf.decode("utf-8"),
        "inclusion": [base64.b64encode(h).decode() for h in proof],
        "checkpoint": note,
    }


@dataclass(frozen=True)
class ProofResult:
    chain_id: str
    epoch: int
    index: int
    tree_size: int
    span_id: str
    signed_by: tuple[str, ...]


def verify_proof(doc: Any, verifiers: Sequence[Verifier]) -> ProofResult:
    """Raise ``ProofInvalid`` unless the proof holds against a checkpoint signed by a pinned key."""
    if not isinstance(doc, dict):
        raise ProofInvalid(f"not an agenttape proof (a JSON {type(doc).__name__}, not an object)")
    try:
        if doc.get("format") != PROOF_FORMAT:
            raise ProofInvalid("not an agenttape proof")
        opened = open_note(doc["checkpoint"], verifiers)
        cp = Checkpoint.parse(opened.text)
        chain_id, epoch, index = str(doc["chain_id"]), int(doc["epoch"]), int(doc["index"])
        if cp.origin != origin_for(chain_id, epoch):
            raise ProofInvalid("checkpoint belongs to another tape")
        if int(doc["tree_size"]) != cp.size:
            raise ProofInvalid("tree size differs from the checkpoint")
        leaf = doc["leaf"].encode("utf-8")
        span = orjson.loads(leaf)
        if not isinstance(span, dict):
            raise ProofInvalid("malformed proof: the leaf is not a JSON object")
        if span.get("span_id") != doc.get("span_id") or span.get("trace_id") != doc.get("trace_id"):
            raise ProofInvalid("leaf is not the named span")
        proof = [base64.b64decode(h, validate=True) for h in doc["inclusion"]]
        verify_inclusion(index, cp.size, leaf_hash(leaf), proof, cp.root)
    except (NoteError, CheckpointError, ProofError) as exc:
        raise ProofInvalid(str(exc)) from exc
    except (KeyError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError) as exc:
        if isinstance(exc, ProofInvalid):
            raise
        raise ProofInvalid(f"malformed proof: {exc}") from exc
    return ProofResult(chain_id, epoch, index, cp.size, span["span_id"], opened.verified)
