"""RFC 9162 (Certificate Transparency v2) Merkle tree: hashing, proofs and their verification.

Leaf hash ``SHA-256(0x00 || leaf)``, interior ``SHA-256(0x01 || left || right)``, the tree split at
the largest power of two below its size. Verification follows RFC 9162 sections 2.1.3.2 and 2.1.4.2
in the form of ``transparency-dev/merkle`` (``proof/verify.go``) and passes its test vectors: hashes
that get hashed must be 32 bytes, and every consistency proof from size 0 is rejected (a witness that
trusts on first use handles size 0 before calling this).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from otel_agenttape import native

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()
_sha256 = hashlib.sha256


class ProofError(ValueError):
    """A proof that does not verify (wrong size, index, hash length or root)."""


# hashlib lets go of the GIL for every update of 2 KiB or more. A sealed span's leaf (~3 KB) is hashed
# in the agent's thread while the exporter thread wants the GIL: a hand-off per span costs two thread
# switches, more CPU than the hash itself. Leaves up to _KEEP_GIL are fed in pieces below that size;
# larger ones (a 1 MB tool result) are hashed in one call, in parallel with Python code.
_PIECE = 2040
_KEEP_GIL = 64 * 1024
_LEAF_PREFIX = _sha256(b"\x00")
# the compiled ``CompactRange.extend`` loop, where built (``tests/test_chain_native.py`` compares both)
_tree_extend = getattr(native.load("otel_agenttape.integrity._chain"), "tree_extend", None)


def leaf_hash(leaf: bytes) -> bytes:
    """``SHA-256(0x00 || leaf)``."""
    h = _LEAF_PREFIX.copy()
    n = len(leaf)
    if n < _PIECE or n > _KEEP_GIL:
        h.update(leaf)
    else:
        view = memoryview(leaf)
        for i in range(0, n, _PIECE):
            h.update(view[i:i + _PIECE])
    return h.digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return _sha256(b"\x01" + left + right).digest()


class CompactRange:
    """Incremental tree: append leaf hashes, read the root at any time in O(log n)."""

    __slots__ = ("_stack", "size")

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[bytes] = []  # perfect subtree roots, largest first

    def append(self, lh: bytes) -> None:
        n = self.size
        self.size = n + 1
        if not n & 1:
            self._stack.append(lh)  # half of all appends: no node to hash
            return
        stack = self._stack
        h = _sha256(b"\x01" + stack.pop() + lh).digest()
        n >>= 1
        while n & 1:
            h = _sha256(b"\x01" + stack.pop() + h).digest()
            n >>= 1
        stack.append(h)

    def extend(self, leaf_hashes: Sequence[bytes]) -> None:
        """``append`` each of ``leaf_hashes`` in order (one call for a batch: less overhead)."""
        if _tree_extend is not None:  # the compiled loop (integrity/_chain.pyx), the same nodes
            self.size = _tree_extend(self._stack, self.size, leaf_hashes)
            return
        stack = self._stack
        push, pop = stack.append, stack.pop
        n = self.size
        for lh in leaf_hashes:
            if not n & 1:
                push(lh)
            else:
                h = _sha256(b"\x01" + pop() + lh).digest()
                m = n >> 1
                while m & 1:
                    h = _sha256(b"\x01" + pop() + h).digest()
                    m >>= 1
                push(h)
            n += 1
        self.size = n

    def root(self) -> bytes:
        if not self._stack:
            return EMPTY_ROOT
        stack = self._stack
        h = stack[-1]
        for left in reversed(stack[:-1]):
            h = node_hash(left, h)
        return h


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    cr = CompactRange()
    for lh in leaf_hashes:
        cr.append(lh)
    return cr.root()


def _split(n: int) -> int:
    k = 1
    while k << 1 < n:
        k <<= 1
    return k


def _subtree(hashes: Sequence[bytes], lo: int, hi: int) -> bytes:
    return root(hashes[lo:hi])


def inclusion_proof(leaf_hashes: Sequence[bytes], index: int) -> list[bytes]:
    """RFC 9162 2.1.3.1 PATH(index, D[0:n]) over leaf hashes."""
    n = len(leaf_hashes)
    if not 0 <= index < n:
        raise ProofError(f"index {index} outside tree of size {n}")
    proof: list[bytes] = []
    lo, hi, m = 0, n, index
    path: list[tuple[int, int]] = []
    while hi - lo > 1:
        k = _split(hi - lo)
        if m < k:
            path.append((lo + k, hi))
            hi = lo + k
        else:
            path.append((lo, lo + k))
            lo, m = lo + k, m - k
    for a, b in reversed(path):
        proof.append(_subtree(leaf_hashes, a, b))
    return proof


def consistency_proof(leaf_hashes: Sequence[bytes], size1: int, size2: int | None = None) -> list[bytes]:
    """RFC 9162 2.1.4.1 PROOF(size1, D[0:size2])."""
    if size2 is None:
        size2 = len(leaf_hashes)
    if not 0 < size1 <= size2 <= len(leaf_hashes):
        raise ProofError(f"bad sizes {size1}, {size2}")
    if size1 == size2:
        return []

    def subproof(m: int, lo: int, hi: int, complete: bool) -> list[bytes]:
        n = hi - lo
        if m == n:
            return [] if complete else [_subtree(leaf_hashes, lo, hi)]
        k = _split(n)
        if m <= k:
            return subproof(m, lo, lo + k, complete) + [_subtree(leaf_hashes, lo + k, hi)]
        return subproof(m - k, lo + k, hi, False) + [_subtree(leaf_hashes, lo, lo + k)]

    return subproof(size1, 0, size2, True)


def _check(h: bytes, what: str) -> None:
    if len(h) != HASH_SIZE:
        raise ProofError(f"{what} has {len(h)} bytes, want {HASH_SIZE}")


def _inner_size(index: int, size: int) -> int:
    return (index ^ (size - 1)).bit_length()


def _chain_inner(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, h in enumerate(proof):
        seed = node_hash(seed, h) if (index >> i) & 1 == 0 else node_hash(h, seed)
    return seed


def _chain_inner_right(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, h in enumerate(proof):
        if (index >> i) & 1 == 1:
            seed = node_hash(h, seed)
    return seed


def _chain_border_right(seed: bytes, proof: Sequence[bytes]) -> bytes:
    for h in proof:
        seed = node_hash(h, seed)
    return seed


def root_from_inclusion_proof(index: int, size: int, leaf_h: bytes, proof: Sequence[bytes]) -> bytes:
    if index < 0 or index >= size:
        raise ProofError(f"index {index} beyond size {size}")
    _check(leaf_h, "leaf hash")
    for h in proof:
        _check(h, "proof hash")
    inner = _inner_size(index, size)
    border = bin(index >> inner).count("1")
    if len(proof) != inner + border:
        raise ProofError(f"proof has {len(proof)} hashes, want {inner + border}")
    res = _chain_inner(leaf_h, proof[:inner], index)
    return _chain_border_right(res, proof[inner:])


def verify_inclusion(index: int, size: int, leaf_h: bytes, proof: Sequence[bytes], root_h: bytes) -> None:
    """Raise ``ProofError`` unless ``proof`` shows leaf ``index`` of a ``size`` tree under ``root_h``."""
    _check(root_h, "root")
    if root_from_inclusion_proof(index, size, leaf_h, proof) != root_h:
        raise ProofError("calculated root does not match")


def verify_consistency(size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes) -> None:
    """Raise ``ProofError`` unless the ``size1`` tree under ``root1`` is a prefix of ``size2``/``root2``."""
    for h in proof:
        _check(h, "proof hash")
    if size1 < 0 or size2 < size1:
        raise ProofError(f"size2 {size2} < size1 {size1}")
    if size1 == 0:
        raise ProofError("consistency proof from an empty tree is meaningless")
    if size1 == size2:
        if proof:
            raise ProofError("size1 == size2 but proof is not empty")
        if root1 != root2:
            raise ProofError("sizes equal but roots differ")
        return  # nothing to hash: equal roots are consistent (as transparency-dev/merkle)
    if not proof:
        raise ProofError("empty proof")
    _check(root1, "root1")
    _check(root2, "root2")
    inner = _inner_size(size1 - 1, size2)
    border = bin((size1 - 1) >> inner).count("1")
    shift = (size1 & -size1).bit_length() - 1
    inner -= shift
    if size1 == 1 << shift:
        seed, start = root1, 0
    else:
        seed, start = proof[0], 1
    if len(proof) != start + inner + border:
        raise ProofError(f"proof has {len(proof)} hashes, want {start + inner + border}")
    rest = proof[start:]
    mask = (size1 - 1) >> shift
    h1 = _chain_border_right(_chain_inner_right(seed, rest[:inner], mask), rest[inner:])
    if h1 != root1:
        raise ProofError("root1 does not match")
    h2 = _chain_border_right(_chain_inner(seed, rest[:inner], mask), rest[inner:])
    if h2 != root2:
        raise ProofError("root2 does not match")

