"""SqlSessionStore specifics: table creation, engines, in-memory SQLite, time queries."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from otel_agenttape.sessions import SessionSnapshot
from otel_agenttape.sessions.sql_store import DEFAULT_TABLE, SqlSessionStore

PG_URL = os.environ.get("AGENTTAPE_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(
    not PG_URL,
    reason="AGENTTAPE_TEST_POSTGRES_URL is not set: run `export AGENTTAPE_TEST_POSTGRES_URL=$(bash .ci/postgres.sh)`",
)


def test_table_is_created_once_and_reused(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with SqlSessionStore(url) as store:
        store.save(SessionSnapshot(session_id="s", agent="a"))
    engine = sa.create_engine(url)
    cols = {c["name"] for c in sa.inspect(engine).get_columns(DEFAULT_TABLE)}
    assert cols == {"session_id", "agent", "version", "updated_at", "data"}
    with engine.connect() as conn:
        row = conn.execute(sa.text(f"SELECT session_id, agent, version FROM {DEFAULT_TABLE}")).one()
    assert tuple(row) == ("s", "a", 1)
    engine.dispose()
    with SqlSessionStore(url) as again:  # table exists: no error, data kept
        assert again.list() == ["s"]


def test_in_memory_sqlite_keeps_data_across_calls() -> None:
    with SqlSessionStore("sqlite://") as store:
        store.save(SessionSnapshot(session_id="m"))
        assert store.load("m").version == 1 and store.list() == ["m"]


def test_shared_engine_is_not_disposed(tmp_path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'e.db'}")
    store = SqlSessionStore(engine, table="custom_sessions")
    store.save(SessionSnapshot(session_id="e"))
    store.close()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM custom_sessions")).scalar() == 1


def test_updated_since(tmp_path) -> None:
    with SqlSessionStore(f"sqlite:///{tmp_path / 't.db'}") as store:
        store.save(SessionSnapshot(session_id="old"))
        cut = datetime.now(timezone.utc)
        store.save(SessionSnapshot(session_id="new"))
        assert store.updated_since(cut - timedelta(hours=1)) == ["new", "old"]
        assert store.updated_since(cut) == ["new"]
        assert store.updated_since(datetime.now(timezone.utc) + timedelta(seconds=5)) == []


@needs_pg
def test_postgres_table_and_time_queries() -> None:
    table = f"sessions_test_{uuid.uuid4().hex[:12]}"
    store = SqlSessionStore(PG_URL, table=table)
    try:
        assert store.engine.dialect.name == "postgresql"
        store.save(SessionSnapshot(session_id="old"))
        cut = datetime.now(timezone.utc)
        store.save(SessionSnapshot(session_id="new", memory={"text": "ü✓ \u2028"}))
        assert store.updated_since(cut) == ["new"]
        with SqlSessionStore(PG_URL, table=table) as other:
            assert other.load("new").memory == {"text": "ü✓ \u2028"}
        cols = {c["name"]: c for c in sa.inspect(store.engine).get_columns(table)}
        assert isinstance(cols["updated_at"]["type"], sa.DateTime) and cols["updated_at"]["type"].timezone
    finally:
        with store.engine.begin() as conn:
            conn.execute(sa.text(f'DROP TABLE IF EXISTS "{table}"'))
        store.close()
