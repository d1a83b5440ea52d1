"""The store contract, run against every backend: a folder of JSON files, SQLite and PostgreSQL.

PostgreSQL cases use the server named by AGENTTAPE_TEST_POSTGRES_URL (``.ci/postgres.sh`` starts
one on 127.0.0.1 and prints it); each test works in a table of its own that is dropped after.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest

from otel_agenttape.sessions import (
    FileSessionStore,
    InvalidSessionId,
    SessionConflict,
    SessionSnapshot,
    SessionStore,
)

PG_ENV = "AGENTTAPE_TEST_POSTGRES_URL"
PG_URL = os.environ.get(PG_ENV)
BACKENDS = ["file", "sqlite", "postgres"]


def _make_factory(kind: str, tmp_path, request) -> Callable[[], SessionStore]:
    """A factory of store objects that all see the same data (like separate processes would)."""
    if kind == "file":
        return lambda: FileSessionStore(tmp_path / "sessions")
    from otel_agenttape.sessions import SqlSessionStore

    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'sessions.db'}"
        table = "agenttape_sessions"
    else:
        if not PG_URL:
            pytest.skip(f"{PG_ENV} is not set: run `export {PG_ENV}=$(bash .ci/postgres.sh)` to test PostgreSQL")
        url = PG_URL
        table = f"sessions_test_{uuid.uuid4().hex[:12]}"
    opened: list = []

    def factory() -> SessionStore:
        s = SqlSessionStore(url, table=table)
        opened.append(s)
        return s

    def cleanup() -> None:
        import sqlalchemy as sa

        if kind == "postgres" and opened:
            with opened[0].engine.begin() as conn:
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{table}"'))
        for s in opened:
            s.close()

    request.addfinalizer(cleanup)
    return factory


@pytest.fixture(params=BACKENDS)
def make_store(request, tmp_path) -> Iterator[Callable[[], SessionStore]]:
    yield _make_factory(request.param, tmp_path, request)


def _snapshot(sid: str = "s-1") -> SessionSnapshot:
    snap = SessionSnapshot(session_id=sid, agent="planner", memory={"facts": ["a", "ü✓"], "count": 1})
    snap.append_event({"type": "user", "text": "hello"})
    snap.record_run("run-1", trace_id="0af7651916cd43dd8448eb211c80319c", span_id="b7ad6b7169203331")
    return snap


def test_save_then_load_in_a_new_store_object(make_store) -> None:
    store = make_store()
    assert isinstance(store, SessionStore)
    snap = _snapshot()
    before = datetime.now(timezone.utc)
    returned = store.save(snap)
    assert returned is snap and snap.version == 1
    assert before - timedelta(seconds=1) <= snap.updated_at <= datetime.now(timezone.utc)

    restored = make_store().load("s-1")  # as after a restart
    assert restored == snap
    assert restored.memory == {"facts": ["a", "ü✓"], "count": 1}
    assert restored.tape_context().previous_run_id == "run-1"
    assert restored.tape_context().traceparent == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_missing_session_loads_as_none(make_store) -> None:
    assert make_store().load("nobody") is None


def test_list_and_delete(make_store) -> None:
    store = make_store()
    assert store.list() == []
    for sid in ("b", "a", "c"):
        store.save(_snapshot(sid))
    assert store.list() == ["a", "b", "c"]
    assert store.delete("b") is True
    assert store.delete("b") is False
    assert make_store().list() == ["a", "c"]
    assert store.load("b") is None


def test_versions_increase_and_later_saves_win(make_store) -> None:
    store = make_store()
    snap = store.save(_snapshot())
    snap.memory["count"] = 2
    snap.append_event({"type": "assistant", "text": "hi"})
    store.save(snap)
    snap.compact("said hello")
    store.save(snap)
    got = make_store().load("s-1")
    assert got.version == 3 and got.memory["count"] == 2
    assert got.events == [] and got.compactions[0]["summary"] == "said hello"
    assert got.compactions[0]["events_compacted"] == 2


def test_two_writers_on_the_same_version_conflict(make_store) -> None:
    a, b = make_store(), make_store()
    a.save(_snapshot())
    first, second = a.load("s-1"), b.load("s-1")
    first.memory["by"] = "first"
    second.memory["by"] = "second"
    a.save(first)
    with pytest.raises(SessionConflict) as info:
        b.save(second)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert second.version == 1  # the refused snapshot is unchanged
    assert make_store().load("s-1").memory["by"] == "first"
    # after a reload the second writer can apply its change
    again = b.load("s-1")
    again.memory["by"] = "second"
    b.save(again)
    assert make_store().load("s-1").memory["by"] == "second"


def test_creating_an_existing_session_conflicts(make_store) -> None:
    store = make_store()
    store.save(_snapshot())
    with pytest.raises(SessionConflict) as info:
        make_store().save(_snapshot())
    assert (info.value.expected, info.value.actual) == (0, 1)


def test_saving_a_deleted_session_conflicts(make_store) -> None:
    store = make_store()
    snap = store.save(_snapshot())
    store.delete("s-1")
    with pytest.raises(SessionConflict) as info:
        store.save(snap)
    assert info.value.actual is None


def test_delete_with_a_stale_version_is_refused(make_store) -> None:
    store = make_store()
    store.save(store.save(_snapshot()))  # version 2
    with pytest.raises(SessionConflict):
        store.delete("s-1", version=1)
    assert store.load("s-1") is not None
    assert store.delete("s-1", version=2) is True
    with pytest.raises(SessionConflict):
        store.delete("s-1", version=2)


def test_concurrent_writers_lose_no_update(make_store) -> None:
    make_store().save(SessionSnapshot(session_id="counter", memory={"n": 0}))
    threads, per_thread = 4, 10
    conflicts = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        store = make_store()
        try:
            for _ in range(per_thread):
                while True:
                    snap = store.load("counter")
                    snap.memory["n"] += 1
                    snap.append_event({"n": snap.memory["n"]})
                    try:
                        store.save(snap)
                        break
                    except SessionConflict:
                        with lock:
                            conflicts[0] += 1
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(60)
    assert not errors, errors
    final = make_store().load("counter")
    total = threads * per_thread
    assert final.memory["n"] == total and final.version == total + 1
    assert [e["n"] for e in final.events] == list(range(1, total + 1))


def test_unserialisable_memory_is_refused_and_nothing_is_stored(make_store) -> None:
    store = make_store()
    snap = SessionSnapshot(session_id="bad", memory={"when": object()})
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        store.save(snap)
    assert snap.version == 0 and store.load("bad") is None and store.list() == []


def test_bad_ids_are_refused_by_every_backend(make_store) -> None:
    store = make_store()
    for bad in ("../x", "a/b", "", "x" * 500, "nul\x00"):
        with pytest.raises(InvalidSessionId):
            store.load(bad)
        with pytest.raises(InvalidSessionId):
            store.delete(bad)


def test_large_session_round_trips(make_store) -> None:
    store = make_store()
    snap = SessionSnapshot(session_id="big", memory={"blob": "x" * 2_000_000})
    for i in range(2000):
        snap.append_event({"i": i, "text": f"event {i}"})
    store.save(snap)
    got = make_store().load("big")
    assert len(got.memory["blob"]) == 2_000_000 and got.events[1999] == {"i": 1999, "text": "event 1999"}
