"""RFC 9162 tree and proofs against the transparency-dev/merkle vectors and a brute-force tree."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from otel_agenttape.integrity import merkle

VECTORS = Path(__file__).resolve().parent / "vectors" / "merkle"


def _b(x):
    return b"" if x is None else base64.b64decode(x)


def _cases(kind: str):
    files = sorted((VECTORS / kind).rglob("*.json"))
    assert len(files) >= 90, f"vectors missing under {VECTORS / kind}"
    return files


@pytest.mark.parametrize("path", _cases("inclusion"), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_inclusion_vectors(path: Path) -> None:
    v = json.loads(path.read_text())
    proof = [_b(h) for h in (v["proof"] or [])]
    args = (v["leafIdx"], v["treeSize"], _b(v["leafHash"]), proof, _b(v["root"]))
    if v["wantErr"]:
        with pytest.raises(merkle.ProofError):
            merkle.verify_inclusion(*args)
    else:
        merkle.verify_inclusion(*args)


@pytest.mark.parametrize("path", _cases("consistency"), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_consistency_vectors(path: Path) -> None:
    v = json.loads(path.read_text())
    proof = [_b(h) for h in (v["proof"] or [])]
    args = (v["size1"], v["size2"], proof, _b(v["root1"]), _b(v["root2"]))
    if v["wantErr"]:
        with pytest.raises(merkle.ProofError):
            merkle.verify_consistency(*args)
    else:
        merkle.verify_consistency(*args)


def _ref_root(hs: list[bytes]) -> bytes:
    if not hs:
        return hashlib.sha256(b"").digest()
    if len(hs) == 1:
        return hs[0]
    k = 1
    while k * 2 < len(hs):
        k *= 2
    return merkle.node_hash(_ref_root(hs[:k]), _ref_root(hs[k:]))


def test_generated_proofs_verify_for_every_index_and_size() -> None:
    hs = [merkle.leaf_hash(str(i).encode()) for i in range(40)]
    for n in range(1, 41):
        root = merkle.root(hs[:n])
        assert root == _ref_root(hs[:n])
        for i in range(n):
            merkle.verify_inclusion(i, n, hs[i], merkle.inclusion_proof(hs[:n], i), root)
            with pytest.raises(merkle.ProofError):
                merkle.verify_inclusion(i, n, hs[(i + 1) % 40], merkle.inclusion_proof(hs[:n], i), root)
        for m in range(1, n + 1):
            merkle.verify_consistency(m, n, merkle.consistency_proof(hs, m, n), merkle.root(hs[:m]), root)


def test_proof_for_a_million_leaf_tape_has_at_most_20_hashes() -> None:
    n = 1_000_000
    # only the path's subtrees matter for its length: compute it from the decomposition
    inner = ((n - 2) ^ (n - 1)).bit_length()
    for index in (0, 1, n // 2, n - 2, n - 1, 524287, 999_999):
        inner = (index ^ (n - 1)).bit_length()
        border = bin(index >> inner).count("1")
        assert inner + border <= 20
    hs = [i.to_bytes(32, "big") for i in range(n)]
    proof = merkle.inclusion_proof(hs, 777_777)
    assert len(proof) <= 20
    merkle.verify_inclusion(777_777, n, hs[777_777], proof, merkle.root(hs))


def test_leaf_hash_is_sha256_of_0x00_and_the_leaf_at_every_size() -> None:
    # leaves are fed to SHA-256 in pieces (to keep the GIL) from 2 KiB up to 64 KiB: same digest
    import hashlib
    import os

    from otel_agenttape.integrity.merkle import leaf_hash

    for n in (0, 1, 2039, 2040, 2041, 4080, 4081, 3000, 65535, 65536, 65537, 300_000):
        leaf = os.urandom(n)
        assert leaf_hash(leaf) == hashlib.sha256(b"\x00" + leaf).digest(), n


def test_compact_range_extend_matches_the_reference_tree() -> None:
    hs = [merkle.leaf_hash(f"leaf {i}".encode()) for i in range(2600)]
    cr = merkle.CompactRange()
    cr.extend(hs[:5])
    cr.extend(hs[5:1500])
    cr.extend([])
    assert (cr.size, cr.root()) == (1500, _ref_root(hs[:1500]))
    cr.append(hs[1500])
    cr.extend(hs[1501:])
    assert (cr.size, cr.root()) == (2600, _ref_root(hs))
