"""Session ids can never name a path outside the store's folder."""

from __future__ import annotations

import os

import pytest

from otel_agenttape.sessions import (
    MAX_SESSION_ID_LENGTH,
    FileSessionStore,
    InvalidSessionId,
    SessionSnapshot,
    validate_session_id,
)

BAD_IDS = [
    ("", "empty"),
    ("..", "'..'"),
    ("a/../b", "path separator"),
    ("../escape", "path separator"),
    ("..escape", "'..'"),
    ("a..b", "'..'"),
    ("/etc/passwd", "path separator"),
    ("sub/dir", "path separator"),
    ("back\\slash", "path separator"),
    ("nul\x00byte", "NUL"),
    (".hidden", "starts with '.'"),
    (".", "starts with '.'"),
    ("x" * (MAX_SESSION_ID_LENGTH + 1), "characters long"),
    ("spa ce", "characters outside"),
    ("new\nline", "characters outside"),
    ("é", "characters outside"),
]


@pytest.mark.parametrize("bad,reason", BAD_IDS)
def test_bad_ids_are_refused_with_a_reason(bad: str, reason: str) -> None:
    with pytest.raises(InvalidSessionId) as info:
        validate_session_id(bad)
    assert reason in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "good",
    ["s1", "3f2b9c1e-7d4a-4f0e-9a51-0c1d2e3f4a5b", "user@example.com:chat", "a.b_c-d", "x" * MAX_SESSION_ID_LENGTH],
)
def test_good_ids_pass(good: str) -> None:
    assert validate_session_id(good) == good


def test_non_string_id_is_refused() -> None:
    with pytest.raises(InvalidSessionId, match="must be a str"):
        validate_session_id(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad,_reason", BAD_IDS)
def test_file_store_refuses_bad_ids_everywhere(tmp_path, bad: str, _reason: str) -> None:
    root = tmp_path / "sessions"
    store = FileSessionStore(root)
    before = sorted(os.listdir(tmp_path))
    for call in (store.load, store.delete, store.path_for):
        with pytest.raises(InvalidSessionId):
            call(bad)
    # a snapshot cannot even be built with such an id, so save never sees one
    with pytest.raises(InvalidSessionId):
        SessionSnapshot(session_id=bad)
    assert sorted(os.listdir(tmp_path)) == before
    assert [p for p in root.iterdir() if p.name != ".lock"] == []


def test_file_store_refuses_an_id_changed_after_construction(tmp_path) -> None:
    store = FileSessionStore(tmp_path / "s")
    snap = SessionSnapshot(session_id="ok")
    snap.session_id = "../../outside"
    with pytest.raises(InvalidSessionId):
        store.save(snap)
    assert not (tmp_path / "outside.json").exists()
    assert not any(tmp_path.rglob("*.json"))
