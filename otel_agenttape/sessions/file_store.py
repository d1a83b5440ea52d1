"""Session snapshots as one JSON file each in a folder: no dependencies beyond the file system.

Writes are atomic (temp file in the same folder, fsync, os.replace, fsync of the folder), so a
crash leaves either the old or the new snapshot, never a torn one. A lock file serialises the
version check and the write across threads and processes on the same machine (POSIX flock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from otel_agenttape.atomicfile import write_atomic
from otel_agenttape.sessions.base import (
    SessionConflict,
    decode,
    encode_for_save,
    mark_saved,
)
from otel_agenttape.sessions.ids import validate_session_id
from otel_agenttape.sessions.snapshot import SessionSnapshot

_SUFFIX = ".json"
_LOCK_NAME = ".lock"
_TMP_PREFIX = ".tmp-"


class FileSessionStore:
    """One ``<session_id>.json`` per session under ``directory`` (created if missing)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)

    def path_for(self, session_id: str) -> Path:
        """The file of a session; the id is validated so the path stays inside the folder."""
        path = self.directory / (validate_session_id(session_id) + _SUFFIX)
        if path.parent != self.directory:  # belt and braces: validation already forbids this
            raise ValueError(f"session id {session_id!r} escapes {self.directory}")
        return path

    def save(self, snapshot: SessionSnapshot) -> SessionSnapshot:
        """Write the snapshot if its version is the stored one; see ``sessions.base``."""
        path = self.path_for(snapshot.session_id)
        data, new_version, now = encode_for_save(snapshot)
        with self._locked():
            actual = self._stored_version(path)
            if actual != (snapshot.version or None):
                raise SessionConflict(snapshot.session_id, snapshot.version, actual)
            self._atomic_write(path, data)
        return mark_saved(snapshot, new_version, now)

    def load(self, session_id: str) -> SessionSnapshot | None:
        """The stored snapshot, or None when the session has no file."""
        path = self.path_for(session_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return decode(data)

    def list(self) -> list[str]:
        """Stored session ids, sorted."""
        ids = []
        for entry in os.scandir(self.directory):
            name = entry.name
            if not name.endswith(_SUFFIX) or name.startswith(".") or not entry.is_file():
                continue
            ids.append(name[: -len(_SUFFIX)])
        return sorted(ids)

    def delete(self, session_id: str, version: int | None = None) -> bool:
        """Remove a session's file; True if it existed. With ``version``, only that version."""
        path = self.path_for(session_id)
        with self._locked():
            actual = self._stored_version(path)
            if actual is None:
                if version is not None:
                    raise SessionConflict(session_id, version, None)
                return False
            if version is not None and version != actual:
                raise SessionConflict(session_id, version, actual)
            path.unlink()
            self._fsync_dir()
        return True

    # --- internals -------------------------------------------------------------------------
    def _stored_version(self, path: Path) -> int | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return decode(data).version

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _atomic_write(self, path: Path, data: bytes) -> None:
        write_atomic(path, data, tmp_dir=self.directory, prefix=_TMP_PREFIX, suffix=".part")
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
