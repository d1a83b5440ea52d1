"""The compiled chain step (``integrity/_chain.pyx``) and SHA-256 (``integrity/_sha256.h``) give the
Python path's hashes: ``Chain.append_hash`` links, heads and Merkle roots, and hashlib's digests."""

from __future__ import annotations

import hashlib
import importlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_agenttape.integrity.chain import Chain, Link, genesis
from otel_agenttape.integrity.merkle import CompactRange, leaf_hash

try:
    _chain = importlib.import_module("otel_agenttape.integrity._chain")
except ImportError:  # not built: only the Python path exists
    _chain = None

pytestmark = pytest.mark.skipif(
    _chain is None, reason="the compiled chain step is not built (python setup.py build_ext --inplace)")
if _chain is not None:
    _chain.set_link_type(Link)  # what chain.py does when it uses the module (not with AGENTTAPE_NO_NATIVE=1)


@pytest.fixture(params=[True, False], ids=["libcrypto", "hashlib"])
def sha_mode(request):
    on = _chain.use_direct_sha256(request.param)
    if request.param and not on:
        pytest.skip("no libcrypto with SHA256_Init in this process")
    yield on
    _chain.use_direct_sha256(True)


def test_sha256_equals_hashlib_at_every_length_around_the_block_size() -> None:
    if _chain.sha256(b"") is None:
        pytest.skip("no libcrypto with SHA256_Init in this process")
    data = bytes(range(256)) * 12
    for n in range(0, len(data) + 1):
        assert _chain.sha256(data[:n]) == hashlib.sha256(data[:n]).digest(), n
    rng = random.Random(7)
    for _ in range(300):
        blob = rng.randbytes(rng.randrange(200_000))
        assert _chain.sha256(blob) == hashlib.sha256(blob).digest()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000))
def test_sha256_generated(blob) -> None:
    got = _chain.sha256(blob)
    assert got is None or got == hashlib.sha256(blob).digest()


def test_append_hash_equals_python_method(sha_mode) -> None:
    rng = random.Random(11)
    for chain_id, epoch in (("run-a", 0), ("\u00e9-run", 3)):
        native, python = Chain(chain_id, epoch), Chain(chain_id, epoch)
        assert native.head == genesis(chain_id, epoch)
        for i in range(1100):  # past several powers of two: every shape of the compact range
            lh = leaf_hash(rng.randbytes(rng.randrange(3000)))
            a = _chain.append_hash(native, lh)
            b = Chain.python_append_hash(python, lh)
            assert a == b and type(a) is type(b)
            assert native.head == python.head and native.size == python.size == i + 1
            if i % 97 == 0 or i < 20:
                assert native.root() == python.root()
        assert native.tree._stack == python.tree._stack


def test_chain_append_uses_the_compiled_step_and_matches() -> None:
    leaves = [f"leaf {i}".encode() for i in range(300)]
    c1, c2 = Chain("t"), Chain("t")
    for leaf in leaves:
        assert c1.append(leaf) == Chain.python_append_hash(c2, leaf_hash(leaf))
    assert c1.root() == c2.root()


def test_odd_inputs_take_the_python_rule() -> None:
    """A head or leaf hash of another length (never made by sealing) gets the Python method's result."""
    for lh in (b"", b"x" * 31, b"x" * 33, b"x" * 64):
        native, python = Chain("odd"), Chain("odd")
        for _ in range(5):
            assert _chain.append_hash(native, lh) == Chain.python_append_hash(python, lh)
        assert native.root() == python.root() and native.head == python.head
    native, python = Chain("odd"), Chain("odd")
    native.head = python.head = "short"
    assert _chain.append_hash(native, b"y" * 32) == Chain.python_append_hash(python, b"y" * 32)
    native.head = python.head = "\u00e9" * 64
    with pytest.raises(UnicodeEncodeError):
        Chain.python_append_hash(python, b"y" * 32)
    with pytest.raises(UnicodeEncodeError):
        _chain.append_hash(native, b"y" * 32)


def test_tree_append_equals_compact_range(sha_mode) -> None:
    a, b = CompactRange(), CompactRange()
    for i in range(700):
        lh = hashlib.sha256(i.to_bytes(4, "big")).digest()
        _chain.tree_append(a, lh)
        b.append(lh)
        assert a.size == b.size and a._stack == b._stack
    assert a.root() == b.root()


def test_tree_extend_equals_the_python_loop(sha_mode, monkeypatch) -> None:
    from otel_agenttape.integrity import merkle

    if merkle._tree_extend is None:
        pytest.skip("compiled paths turned off (AGENTTAPE_NO_NATIVE) or not built")
    leaves = [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(1000)]
    leaves[17] = b"short"  # not a hash: hashed as merkle.py hashes it
    a = CompactRange()
    sizes = [0, 1, 2, 3, 7, 64, 100, 300, 523]
    for lo, hi in zip(sizes, sizes[1:] + [len(leaves)]):
        a.extend(leaves[lo:hi])
    monkeypatch.setattr(merkle, "_tree_extend", None)
    b = CompactRange()
    b.extend(leaves)
    assert (a.size, a._stack, a.root()) == (b.size, b._stack, b.root())
