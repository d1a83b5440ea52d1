"""C2SP signed-note known answers, key formats and checkpoint bodies."""

from __future__ import annotations

import pytest

from otel_agenttape.integrity.checkpoint import (
    Checkpoint,
    CheckpointError,
    origin_for,
    parse_origin,
)
from otel_agenttape.integrity.note import (
    NoteError,
    Signer,
    Verifier,
    open_note,
    sign_note,
)

# c2sp.org/signed-note, "Example"
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n"
    "\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)
# golang.org/x/mod/sumdb/note package documentation
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_SIG = "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"


def test_spec_example_verifies() -> None:
    v = Verifier.parse(SPEC_VKEY)
    assert v.id.hex() == "530d903a"
    assert v.vkey() == SPEC_VKEY
    opened = open_note(SPEC_NOTE, [v])
    assert opened.text == "This is an example message.\n"
    assert opened.verified == ("example.com/foo",)


def test_spec_example_rejects_tampered_text_and_unknown_keys() -> None:
    v = Verifier.parse(SPEC_VKEY)
    with pytest.raises(NoteError):
        open_note(SPEC_NOTE.replace("example message", "exemple message"), [v])
    with pytest.raises(NoteError):
        open_note(SPEC_NOTE, [Signer.generate("example.com/bar").verifier()])
    with pytest.raises(NoteError):
        Verifier.parse(SPEC_VKEY.replace("530d903a", "530d903b"))


def test_go_signer_key_reproduces_the_documented_signature() -> None:
    s = Signer.parse(GO_SKEY)
    assert s.verifier().vkey() == GO_VKEY
    assert sign_note(GO_TEXT, [s]) == GO_TEXT + "\n" + GO_SIG
    assert s.skey() == GO_SKEY


def test_unknown_signatures_are_ignored_when_a_known_one_verifies() -> None:
    a, b = Signer.generate("a.example/log"), Signer.generate("b.example/other")
    note = sign_note("hello\n", [b, a])
    assert open_note(note, [a.verifier()]).verified == ("a.example/log",)


def test_checkpoint_body_round_trip_and_origins() -> None:
    cp = Checkpoint(origin_for("run 1+x"), 7, bytes(range(32)), ("chain " + "ab" * 32,))
    assert " " not in cp.origin and "+" not in cp.origin
    assert Checkpoint.parse(cp.body()) == cp
    assert parse_origin(origin_for("run/1", 3)) == ("run/1", 3)
    assert cp.body().splitlines()[1] == "7"
    for bad in ("o\n01\n" + "A" * 43 + "=\n", "o\n1\nAAAA\n", "o\n1\n"):
        with pytest.raises(CheckpointError):
            Checkpoint.parse(bad)
