"""Session snapshots as rows of one table in any SQLAlchemy database (SQLite, PostgreSQL, ...).

One row per session: the id, agent, version, update time and the snapshot as a JSON document.
Saves are optimistic: an INSERT for version 0, otherwise an UPDATE guarded by ``version = :old``,
so of two writers that loaded the same version exactly one succeeds.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from otel_agenttape.sessions.base import SessionConflict, decode, encode_for_save, mark_saved
from otel_agenttape.sessions.ids import MAX_SESSION_ID_LENGTH, validate_session_id
from otel_agenttape.sessions.snapshot import SessionSnapshot

DEFAULT_TABLE = "agenttape_sessions"


def _table(name: str, metadata: sa.MetaData) -> sa.Table:
    return sa.Table(
        name,
        metadata,
        sa.Column("session_id", sa.String(MAX_SESSION_ID_LENGTH), primary_key=True),
        sa.Column("agent", sa.String(512), nullable=True),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data", sa.Text, nullable=False),
    )


class SqlSessionStore:
    """Sessions in table ``table`` (created if missing) of the database at ``url``.

    ``url`` is a SQLAlchemy URL (``sqlite:///path.db``, ``postgresql+psycopg://user:pw@host/db``)
    or an existing ``sqlalchemy.Engine``. Call ``close()`` to release the connection pool when
    the store created the engine.
    """

    def __init__(
        self,
        url: str | sa.Engine,
        *,
        table: str = DEFAULT_TABLE,
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(url, sa.Engine):
            self.engine = url
            self._owns_engine = False
        else:
            self.engine = sa.create_engine(url, **_engine_options(url, engine_options))
            self._owns_engine = True
        self._metadata = sa.MetaData()
        self.table = _table(table, self._metadata)
        self._metadata.create_all(self.engine, checkfirst=True)

    def save(self, snapshot: SessionSnapshot) -> SessionSnapshot:
        """Write the snapshot if its version is the stored one; see ``sessions.base``."""
        sid = validate_session_id(snapshot.session_id)
        data, new_version, now = encode_for_save(snapshot)
        t = self.table
        values = {"agent": snapshot.agent, "version": new_version, "updated_at": now, "data": data.decode()}
        if snapshot.version == 0:
            try:
                with self.engine.begin() as conn:
                    conn.execute(sa.insert(t).values(session_id=sid, **values))
            except IntegrityError:
                raise SessionConflict(sid, 0, self._stored_version(sid)) from None
        else:
            with self.engine.begin() as conn:
                result = conn.execute(
                    sa.update(t)
                    .where(t.c.session_id == sid, t.c.version == snapshot.version)
                    .values(**values)
                )
                if result.rowcount != 1:
                    raise SessionConflict(sid, snapshot.version, self._stored_version(sid, conn))
        return mark_saved(snapshot, new_version, now)

    def load(self, session_id: str) -> SessionSnapshot | None:
        """The stored snapshot, or None when there is no row for the session."""
        sid = validate_session_id(session_id)
        with self.engine.connect() as conn:
            data = conn.execute(
                sa.select(self.table.c.data).where(self.table.c.session_id == sid)
            ).scalar_one_or_none()
        return None if data is None else decode(data)

    def list(self) -> list[str]:
        """Stored session ids, sorted."""
        with self.engine.connect() as conn:
            ids = conn.execute(sa.select(self.table.c.session_id)).scalars().all()
        return sorted(ids)

    def delete(self, session_id: str, version: int | None = None) -> bool:
        """Remove a session's row; True if it existed. With ``version``, only that version."""
        sid = validate_session_id(session_id)
        t = self.table
        cond = t.c.session_id == sid
        if version is not None:
            cond = sa.and_(cond, t.c.version == version)
        with self.engine.begin() as conn:
            deleted = conn.execute(sa.delete(t).where(cond)).rowcount
            if deleted == 0 and version is not None:
                raise SessionConflict(sid, version, self._stored_version(sid, conn))
        return deleted > 0

    def updated_since(self, since: datetime) -> list[str]:
        """Ids of sessions saved at or after ``since`` (timezone-aware; naive means UTC)."""
        if since.tzinfo is None:
            since = since.replace(tzinfo=timezone.utc)
        since = since.astimezone(timezone.utc)
        with self.engine.connect() as conn:
            ids = conn.execute(
                sa.select(self.table.c.session_id).where(self.table.c.updated_at >= since)
            ).scalars().all()
        return sorted(ids)

    def close(self) -> None:
        """Release the connection pool (only when this store created the engine)."""
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> "SqlSessionStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stored_version(self, sid: str, conn: sa.Connection | None = None) -> int | None:
        query = sa.select(self.table.c.version).where(self.table.c.session_id == sid)
        if conn is not None:
            return conn.execute(query).scalar_one_or_none()
        with self.engine.connect() as c:
            return c.execute(query).scalar_one_or_none()


def _engine_options(url: str, extra: dict[str, Any] | None) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            # One shared connection, or each checkout would see its own empty in-memory database.
            opts["poolclass"] = sa.pool.StaticPool
            opts["connect_args"] = {"check_same_thread": False}
        else:
            opts["connect_args"] = {"timeout": 30}
    else:
        opts["pool_pre_ping"] = True
    opts.update(extra or {})
    return opts
