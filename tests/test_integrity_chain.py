"""Chain links, genesis binding, and the pure verifier's reasons."""

from __future__ import annotations

import hashlib

from otel_agenttape.integrity import (
    Chain,
    Entry,
    Signer,
    genesis,
    link_from_leaf_hash,
    link_hash,
    merkle,
    parse_notes,
    sign_note,
    verify_chain,
)
from otel_agenttape.integrity.chain import genesis_v1
from otel_agenttape.integrity.checkpoint import Checkpoint


def _tape(n: int, chain_id: str = "t1", epoch: int = 0):
    chain = Chain(chain_id, epoch)
    leaves = [f'{{"n":{i}}}'.encode() for i in range(n)]
    entries = []
    for leaf in leaves:
        link = chain.append(leaf)
        entries.append(Entry(link.seq, link.prev, link.hash, leaf))
    return chain, entries


def test_link_is_sha256_of_prev_bar_merkle_leaf_hash_and_genesis_binds_the_tape() -> None:
    # chain format v2: the leaf enters the link as the hex of its RFC 9162 leaf hash SHA-256(0x00 || leaf)
    leaf_h = hashlib.sha256(b"\x00{}").digest()
    assert link_hash("ab", b"{}") == hashlib.sha256(b"ab|" + leaf_h.hex().encode()).hexdigest()
    assert link_from_leaf_hash("ab", leaf_h) == link_hash("ab", b"{}")
    assert genesis("a") == hashlib.sha256(b"agenttape/genesis/v2\nagenttape.dev/tape/a\n").hexdigest()
    assert genesis("a") != genesis("b") != genesis("a", 1)
    assert genesis("a") != "0" * 64
    chain, entries = _tape(3)
    assert entries[0].prev == genesis("t1") and entries[1].prev == entries[0].hash
    assert entries[2].hash == link_hash(entries[1].hash, entries[2].leaf) == chain.head
    assert chain.root() == merkle.root([merkle.leaf_hash(e.leaf) for e in entries])


def test_a_format_v1_tape_is_named_as_such() -> None:
    """A tape sealed with links over the leaf bytes starts from the v1 genesis: said so, not "spliced"."""
    prev, entries = genesis_v1("t1"), []
    for i in range(3):
        leaf = f'{{"n":{i}}}'.encode()
        h = hashlib.sha256(prev.encode() + b"|" + leaf).hexdigest()
        entries.append(Entry(i, prev, h, leaf))
        prev = h
    r = verify_chain("t1", 0, entries)
    assert not r.valid and r.first_broken_index == 0 and "format v1" in r.reason


def test_untouched_tape_verifies() -> None:
    _, entries = _tape(10)
    r = verify_chain("t1", 0, entries)
    assert r.valid and r.length == 10 and r.first_broken_index is None


def test_tamper_hook_edit_delete_swap_splice() -> None:
    _, entries = _tape(10)
    edited = list(entries)
    edited[4] = Entry(4, entries[4].prev, entries[4].hash, b'{"n":"edited"}')  # payload replaced, not re-sealed
    r = verify_chain("t1", 0, edited)
    assert (r.valid, r.first_broken_index) == (False, 4) and "edited" in r.reason

    deleted = entries[:5] + entries[6:]
    r = verify_chain("t1", 0, deleted)
    assert (r.first_broken_index, r.reason) == (5, "missing seq 5..5")
    assert r.issues[0].kind == "gap"

    # renumbered after deleting (no gap left): the link breaks
    renum = entries[:5] + [Entry(e.seq - 1, e.prev, e.hash, e.leaf) for e in entries[6:]]
    r = verify_chain("t1", 0, renum)
    assert r.first_broken_index == 5 and "does not link" in r.reason

    swapped = list(entries)
    swapped[3], swapped[4] = (Entry(3, entries[4].prev, entries[4].hash, entries[4].leaf),
                              Entry(4, entries[3].prev, entries[3].hash, entries[3].leaf))
    r = verify_chain("t1", 0, swapped)
    assert r.first_broken_index == 3 and "reordered" in r.reason

    _, other = _tape(10, "t2")
    r = verify_chain("t1", 0, entries[:5] + other[5:])
    assert r.first_broken_index == 5 and not r.valid
    r = verify_chain("t1", 0, other)
    assert r.first_broken_index == 0 and "genesis" in r.reason


def test_checkpoints_catch_truncation_and_reseal() -> None:
    key, attacker = Signer.generate("k.example/agent"), Signer.generate("k.example/agent")
    _, entries = _tape(8)
    notes = []
    c2 = Chain("t1")
    for e in entries:
        c2.append(e.leaf)
        if c2.size in (4, 8):
            cp = Checkpoint(c2.origin, c2.size, c2.root(), (f"chain {c2.head}",))
            notes.append((sign_note(cp.body(), [key]), "file"))
    cps = parse_notes(notes, [key.verifier()])
    assert verify_chain("t1", 0, entries, cps, key_pinned=True).valid
    r = verify_chain("t1", 0, entries[:6], cps, key_pinned=True)
    assert (r.first_broken_index, r.reason) == (6, "truncated: signed checkpoint covers 8 entries, found 6")

    # full re-seal from seq 5 on, with checkpoints signed by a key with the same name
    forged, fnotes = Chain("t1"), []
    resealed = []
    for i, e in enumerate(entries):
        leaf = e.leaf if i < 5 else b'{"n":"forged"}'
        link = forged.append(leaf)
        resealed.append(Entry(link.seq, link.prev, link.hash, leaf))
    cp = Checkpoint(forged.origin, 8, forged.root(), (f"chain {forged.head}",))
    fnotes.append((sign_note(cp.body(), [attacker]), "store"))
    assert verify_chain("t1", 0, resealed).valid  # the chain alone cannot tell
    r = verify_chain("t1", 0, resealed, parse_notes(fnotes, [key.verifier()]), key_pinned=True)
    assert not r.valid and "no checkpoint signed by the trusted key" in r.reason
    r = verify_chain("t1", 0, resealed, parse_notes(fnotes + notes, [key.verifier()]), key_pinned=True)
    assert r.first_broken_index == 4 and "re-sealed" in r.reason
