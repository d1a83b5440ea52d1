"""Session id validation shared by every store, so an id can never name a path outside a store."""

from __future__ import annotations

import re

MAX_SESSION_ID_LENGTH = 200
_ALLOWED = re.compile(r"[A-Za-z0-9._:@-]+")


class InvalidSessionId(ValueError):
    """A session id that a store refuses (path tricks, odd characters, too long)."""


def validate_session_id(session_id: object) -> str:
    """Return the id unchanged if it is safe as a file name and a key, else raise InvalidSessionId.

    Allowed: 1..200 characters from letters, digits and ``. _ : @ -``, not starting with a dot
    and never containing ``..``. That rules out slashes, backslashes, NUL, absolute paths and
    ``.``/``..`` before any file system call is made.
    """
    if not isinstance(session_id, str):
        raise InvalidSessionId(f"session id must be a str, got {type(session_id).__name__}")
    if not session_id:
        raise InvalidSessionId("session id is empty")
    shown = repr(session_id[:60]) + ("..." if len(session_id) > 60 else "")
    if len(session_id) > MAX_SESSION_ID_LENGTH:
        raise InvalidSessionId(
            f"session id {shown} is {len(session_id)} characters long (max {MAX_SESSION_ID_LENGTH})"
        )
    if "\x00" in session_id:
        raise InvalidSessionId(f"session id {shown} contains a NUL character")
    if "/" in session_id or "\\" in session_id:
        raise InvalidSessionId(f"session id {shown} contains a path separator")
    if ".." in session_id:
        raise InvalidSessionId(f"session id {shown} contains '..'")
    if session_id.startswith("."):
        raise InvalidSessionId(f"session id {shown} starts with '.'")
    if not _ALLOWED.fullmatch(session_id):
        raise InvalidSessionId(
            f"session id {shown} has characters outside letters, digits and '._:@-'"
        )
    return session_id
