"""Session stores: snapshots of an agent session (memory, event log, compactions, tape position)
that survive restarts, in a folder of JSON files or in a SQL database."""

from __future__ import annotations

from otel_agenttape.sessions.base import SessionConflict, SessionStore
from otel_agenttape.sessions.file_store import FileSessionStore
from otel_agenttape.sessions.ids import MAX_SESSION_ID_LENGTH, InvalidSessionId, validate_session_id
from otel_agenttape.sessions.snapshot import SessionSnapshot, TapeContext, TapePosition

__all__ = [
    "FileSessionStore",
    "InvalidSessionId",
    "MAX_SESSION_ID_LENGTH",
    "SessionConflict",
    "SessionSnapshot",
    "SessionStore",
    "SqlSessionStore",
    "TapeContext",
    "TapePosition",
    "validate_session_id",
]


def __getattr__(name: str):  # SQLAlchemy is only imported by those who use the SQL store
    if name == "SqlSessionStore":
        from otel_agenttape.sessions.sql_store import SqlSessionStore

        return SqlSessionStore
    raise AttributeError(name)
