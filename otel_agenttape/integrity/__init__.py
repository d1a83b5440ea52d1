"""Integrity: canonical span leaves, the per-tape hash chain, RFC 9162 Merkle proofs, signed checkpoints.

Pure code (no SDK servers, no DuckDB). ``docs/integrity.md`` specifies the formats.
"""

from otel_agenttape.integrity.chain import Chain, Link, genesis, link_from_leaf_hash, link_hash
from otel_agenttape.integrity.checkpoint import (
    Checkpoint,
    CheckpointError,
    origin_for,
    parse_origin,
)
from otel_agenttape.integrity.jcs import CanonicalError
from otel_agenttape.codec.typed import NotOtlpSafe, otlp_safe_attributes
from otel_agenttape.integrity.leaf import LEAF_VERSION, leaf_from_proto, leaf_from_row
from otel_agenttape.integrity.leaf_fast import leaf_from_sdk
from otel_agenttape.integrity.merkle import (
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from otel_agenttape.integrity.note import (
    NoteError,
    Signer,
    Verifier,
    open_note,
    sign_note,
)
from otel_agenttape.integrity.proof import ProofInvalid, build_proof, verify_proof
from otel_agenttape.integrity.verify import (
    ChainReport,
    Entry,
    SignedCheckpoint,
    parse_notes,
    verify_chain,
)

__all__ = [
    "LEAF_VERSION",
    "CanonicalError",
    "Chain",
    "ChainReport",
    "Checkpoint",
    "CheckpointError",
    "Entry",
    "Link",
    "NotOtlpSafe",
    "NoteError",
    "ProofError",
    "ProofInvalid",
    "SignedCheckpoint",
    "Signer",
    "Verifier",
    "build_proof",
    "consistency_proof",
    "genesis",
    "inclusion_proof",
    "leaf_from_proto",
    "leaf_from_row",
    "leaf_from_sdk",
    "leaf_hash",
    "link_from_leaf_hash",
    "link_hash",
    "open_note",
    "origin_for",
    "otlp_safe_attributes",
    "parse_notes",
    "parse_origin",
    "sign_note",
    "verify_chain",
    "verify_consistency",
    "verify_inclusion",
    "verify_proof",
]
