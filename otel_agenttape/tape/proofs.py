"""Offline inclusion proofs of sealed spans: the leaf, its Merkle inclusion proof and a signed
checkpoint of its tape that covers it, checked against the stored tape before it is handed out."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from otel_agenttape.integrity.checkpoint import parse_origin
from otel_agenttape.integrity.note import Verifier
from otel_agenttape.integrity.verify import Entry, parse_notes
from otel_agenttape.tape.sealed_rows import load_rows, row_entry
from otel_agenttape.tape.verification import file_notes, store_notes


class ProveError(Exception):
    """The span cannot be proven (not sealed, no covering checkpoint, tape does not verify)."""


def prove_span(
    reader: Any,
    span_id: str,
    *,
    verifiers: Sequence[Verifier] = (),
    checkpoint_files: Sequence[str | os.PathLike[str]] = (),
) -> dict[str, Any]:
    """A self-contained proof (leaf, inclusion proof, signed checkpoint) for one sealed span."""
    from otel_agenttape.integrity.merkle import CompactRange, leaf_hash
    from otel_agenttape.integrity.proof import build_proof

    span_id = span_id.lower()
    found = load_rows(reader, "span_id = ? AND chain_id IS NOT NULL", [span_id])
    if not found:
        raise ProveError(f"no sealed span {span_id} in the store")
    chain_id, epoch, target = row_entry(found[0])
    if target.problem or target.leaf is None:
        raise ProveError(f"span {span_id} does not verify: {target.problem}")
    entries = {}
    for row in load_rows(reader, "chain_id = ?", [chain_id]):
        cid, ep, e = row_entry(row)
        if (cid, ep, e.trace_id) == (chain_id, epoch, target.trace_id):  # a chain lives in one trace
            entries[e.seq] = e
    checkpoints = parse_notes(store_notes(reader) + file_notes(checkpoint_files), verifiers)
    candidates = sorted(
        (c for c in checkpoints
         if c.trusted is not False and c.checkpoint.size > target.seq
         and parse_origin(c.checkpoint.origin) == (chain_id, epoch) and _names_own_head(c.checkpoint, entries)),
        key=lambda c: c.checkpoint.size,
    )
    if not candidates:
        raise ProveError(f"no signed checkpoint of tape {chain_id} covers seq {target.seq} yet")
    leaves: list[bytes] = []
    cr = CompactRange()
    for c in candidates:
        size = c.checkpoint.size
        while len(leaves) < size:
            e = entries.get(len(leaves))
            if e is None or e.leaf is None:
                raise ProveError(f"tape {chain_id} is missing seq {len(leaves)}: cannot rebuild the tree")
            leaves.append(e.leaf)
            cr.append(leaf_hash(e.leaf))
        if cr.root() == c.checkpoint.root:
            return build_proof(chain_id, epoch, target.seq, leaves[:size], c.note)
    raise ProveError(f"the stored tape {chain_id} does not match its signed checkpoints (run agenttape verify)")


def _names_own_head(cp: Any, entries: dict[int, Entry]) -> bool:
    """Whether a checkpoint's chain head is this chain's entry at ``size - 1`` (or it names none)."""
    head = cp.chain_head
    if head is None:
        return True
    e = entries.get(cp.size - 1)
    return e is not None and e.hash == head
