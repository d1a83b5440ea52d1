"""The per-tape hash chain: ``hash_i = sha256(prev || "|" || leaf_i)`` in lowercase hex.

As in the baseline design, but the genesis ``prev`` of seq 0 is not 64 zeros: it is
``sha256("agenttape/genesis/v1\\n" || origin || "\\n")`` where the origin names the tape and its epoch
(``checkpoint.origin_for``), so a prefix of one tape is never a valid prefix of another, and a
restored tape (a new epoch) never continues the old chain silently.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from otel_agenttape.integrity.checkpoint import origin_for
from otel_agenttape.integrity.merkle import CompactRange, leaf_hash

_sha256 = hashlib.sha256


def genesis(chain_id: str, epoch: int = 0) -> str:
    """The ``prev`` of seq 0 for a tape (chain id) and epoch."""
    return _sha256(b"agenttape/genesis/v1\n" + origin_for(chain_id, epoch).encode("utf-8") + b"\n").hexdigest()


def link_hash(prev: str, leaf: bytes) -> str:
    """``sha256(prev || "|" || leaf)`` as lowercase hex; ``prev`` is the previous hash in hex."""
    return _sha256(prev.encode("ascii") + b"|" + leaf).hexdigest()


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
        prev = self.head
        h = link_hash(prev, leaf)
        link = Link(self.chain_id, self.epoch, self.size, prev, h)
        self.head = h
        self.size += 1
        self.tree.append(leaf_hash(leaf))
        return link

    def root(self) -> bytes:
        return self.tree.root()
