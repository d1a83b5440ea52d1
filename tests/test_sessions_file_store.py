"""FileSessionStore specifics: one readable JSON file per session, atomic replacement, cross-process lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from otel_agenttape.sessions import FileSessionStore, SessionSnapshot


def test_one_json_file_per_session(tmp_path) -> None:
    store = FileSessionStore(tmp_path / "nested" / "sessions")
    store.save(SessionSnapshot(session_id="alpha", agent="a", memory={"k": "v"}))
    store.save(SessionSnapshot(session_id="beta"))
    files = sorted(p.name for p in (tmp_path / "nested" / "sessions").iterdir() if not p.name.startswith("."))
    assert files == ["alpha.json", "beta.json"]
    doc = json.loads((tmp_path / "nested" / "sessions" / "alpha.json").read_text())
    assert doc["session_id"] == "alpha" and doc["memory"] == {"k": "v"} and doc["version"] == 1


def test_stray_files_are_not_listed(tmp_path) -> None:
    store = FileSessionStore(tmp_path)
    store.save(SessionSnapshot(session_id="real"))
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".tmp-abc.part").write_text("x")
    (tmp_path / "dir.json").mkdir()
    assert store.list() == ["real"]


def test_a_failed_write_leaves_the_old_snapshot_and_no_temp_file(tmp_path, monkeypatch) -> None:
    store = FileSessionStore(tmp_path)
    snap = store.save(SessionSnapshot(session_id="s", memory={"v": 1}))
    snap.memory["v"] = 2

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        store.save(snap)
    monkeypatch.undo()
    assert snap.version == 1  # not marked saved
    assert store.load("s").memory == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "s.json"]
    store.save(snap)
    assert store.load("s").memory == {"v": 2}


def test_writers_in_separate_processes_lose_no_update(tmp_path) -> None:
    FileSessionStore(tmp_path).save(SessionSnapshot(session_id="c", memory={"n": 0}))
    script = textwrap.dedent(
        f"""
        from otel_agenttape.sessions import FileSessionStore, SessionConflict
        store = FileSessionStore({str(tmp_path)!r})
        for _ in range(15):
            while True:
                snap = store.load("c")
                snap.memory["n"] += 1
                try:
                    store.save(snap)
                    break
                except SessionConflict:
                    pass
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(3)]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    final = FileSessionStore(tmp_path).load("c")
    assert final.memory["n"] == 45 and final.version == 46
