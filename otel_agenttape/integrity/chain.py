"""The per-tape hash chain (format v2): ``hash_i = sha256(prev || "|" || hex(leaf_hash(leaf_i)))``.

The baseline rule ``sha256(prev || "|" || leaf)`` with ``leaf`` taken to be the leaf's RFC 9162 Merkle
leaf hash ``SHA-256(0x00 || leaf)`` in lowercase hex: the one SHA-256 over the (kilobytes long) leaf
feeds both the chain link and the Merkle tree, and the link itself hashes 130 bytes.
The genesis ``prev`` of seq 0 is not 64 zeros: it is
``sha256("agenttape/genesis/v2\\n" || origin || "\\n")`` where the origin names the tape and its epoch
(``checkpoint.origin_for``), so a prefix of one tape is never a valid prefix of another, and a
restored tape (a new epoch) never continues the old chain silently. The ``v2`` names the link rule:
a tape sealed with format v1 (links over the leaf bytes) starts from ``genesis_v1`` instead.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from otel_agenttape import native
from otel_agenttape.integrity.checkpoint import origin_for
from otel_agenttape.integrity.merkle import CompactRange, leaf_hash

_sha256 = hashlib.sha256
_tuple_new = tuple.__new__
CHAIN_FORMAT = 2


def genesis(chain_id: str, epoch: int = 0) -> str:
    """The ``prev`` of seq 0 for a tape (chain id) and epoch."""
    return _sha256(b"agenttape/genesis/v2\n" + origin_for(chain_id, epoch).encode("utf-8") + b"\n").hexdigest()


def genesis_v1(chain_id: str, epoch: int = 0) -> str:
    """The genesis of chain format v1, only to name such a tape when it is met."""
    return _sha256(b"agenttape/genesis/v1\n" + origin_for(chain_id, epoch).encode("utf-8") + b"\n").hexdigest()


def link_from_leaf_hash(prev: str, leaf_h: bytes) -> str:
    """``sha256(prev || "|" || hex(leaf_h))`` as lowercase hex, from a Merkle leaf hash (a ``prev`` that
    is not hex, as only an edited store holds, is hashed as UTF-8: a link that matches nothing, not an error)."""
    return _sha256((prev + "|" + leaf_h.hex()).encode("utf-8", "surrogatepass")).hexdigest()


def link_hash(prev: str, leaf: bytes) -> str:
    """The link of ``leaf`` after ``prev`` (lowercase hex): ``link_from_leaf_hash(prev, leaf_hash(leaf))``."""
    return _sha256((prev + "|" + leaf_hash(leaf).hex()).encode("utf-8", "surrogatepass")).hexdigest()


class Link(NamedTuple):
    """One sealed entry's chain fields (a tuple: cheap to create on the hot path)."""

    chain_id: str
    epoch: int
    seq: int
    prev: str
    hash: str


class Chain:
    """Appends leaves to one tape's chain and keeps the RFC 9162 tree over them (not thread-safe)."""

    __slots__ = ("chain_id", "epoch", "head", "origin", "size", "tree")

    def __init__(self, chain_id: str, epoch: int = 0) -> None:
        self.chain_id = chain_id
        self.epoch = epoch
        self.origin = origin_for(chain_id, epoch)
        self.size = 0
        self.head = genesis(chain_id, epoch)
        self.tree = CompactRange()

    def append(self, leaf: bytes) -> Link:
        return self.append_hash(leaf_hash(leaf))  # the one hash over the leaf bytes

    def python_append_hash(self, lh: bytes) -> Link:
        """``append`` of the leaf whose Merkle leaf hash is ``lh`` (sealing hashes while it writes).

        ``append_hash`` is this method, or its compiled twin (``_chain.pyx``) when built.
        """
        prev = self.head
        h = _sha256((prev + "|" + lh.hex()).encode("ascii")).hexdigest()
        seq = self.size
        self.head = h
        self.size = seq + 1
        self.tree.append(lh)
        return _tuple_new(Link, (self.chain_id, self.epoch, seq, prev, h))

    append_hash = python_append_hash

    def root(self) -> bytes:
        return self.tree.root()


_native = native.load("otel_agenttape.integrity._chain")
NATIVE = _native is not None
if _native is not None:
    _native.set_link_type(Link)
    Chain.append_hash = _native.append_hash  # type: ignore[method-assign]

_native_sha256 = _native.sha256 if _native is not None else None


def sha256_digest(data: bytes) -> bytes:
    """SHA-256 of ``data``: libcrypto called directly when the compiled chain is built (hashlib's
    per-call set-up costs more than hashing a short content value), else hashlib."""
    if _native_sha256 is not None:
        d = _native_sha256(data)
        if d is not None:
            return d
    return _sha256(data).digest()
