"""What every session store promises, and the errors they share.

Contract (FileSessionStore and SqlSessionStore behave the same):
- ``save(snapshot)`` stores the snapshot only if ``snapshot.version`` equals the stored version
  (0 for a session not stored yet). On success it sets ``snapshot.version`` to the new version
  and ``snapshot.updated_at`` to now, and returns the snapshot; otherwise it raises
  ``SessionConflict`` and stores nothing. Two writers that loaded the same version can therefore
  not silently overwrite each other: the second one must reload and reapply its change.
- ``load(session_id)`` returns the stored snapshot, or ``None`` when there is none.
- ``list()`` returns the stored session ids, sorted.
- ``delete(session_id, version=None)`` returns True if a session was removed, False if there was
  none; with ``version`` it removes only that version and raises ``SessionConflict`` otherwise.
- Every id goes through ``validate_session_id`` (``InvalidSessionId``, a ValueError) first.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Protocol, runtime_checkable

import orjson

from otel_agenttape.sessions.snapshot import SessionSnapshot


class SessionConflict(RuntimeError):
    """A save or delete based on a version that is no longer the stored one."""

    def __init__(self, session_id: str, expected: int, actual: int | None) -> None:
        self.session_id = session_id
        self.expected = expected
        self.actual = actual
        stored = "no stored session" if actual is None else f"stored version {actual}"
        super().__init__(
            f"session {session_id!r}: write based on version {expected} but found {stored}; "
            "reload the session and apply the change again"
        )


@runtime_checkable
class SessionStore(Protocol):
    """A place that keeps session snapshots across restarts."""

    def save(self, snapshot: SessionSnapshot) -> SessionSnapshot: ...

    def load(self, session_id: str) -> SessionSnapshot | None: ...

    def list(self) -> list[str]: ...

    def delete(self, session_id: str, version: int | None = None) -> bool: ...


def encode_for_save(snapshot: SessionSnapshot) -> tuple[bytes, int, datetime]:
    """The JSON document for the next version of ``snapshot``, with that version and time."""
    new_version = snapshot.version + 1
    now = datetime.now(timezone.utc)
    doc: dict[str, Any] = snapshot.to_dict()
    doc["version"] = new_version
    doc["updated_at"] = now.isoformat()
    try:
        data = orjson.dumps(doc)
    except TypeError as exc:
        raise TypeError(f"session {snapshot.session_id!r} is not JSON-serialisable: {exc}") from exc
    return data, new_version, now


def decode(data: bytes | str) -> SessionSnapshot:
    """Parse a stored JSON document."""
    return SessionSnapshot.from_dict(orjson.loads(data))


def mark_saved(snapshot: SessionSnapshot, version: int, when: datetime) -> SessionSnapshot:
    snapshot.version = version
    snapshot.updated_at = when
    return snapshot
