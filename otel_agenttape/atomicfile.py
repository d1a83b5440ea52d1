"""Whole-file writes that a crash cannot leave half done."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], data: bytes, *, tmp_dir: str | os.PathLike[str] | None = None,
                 prefix: str | None = None, suffix: str = ".tmp") -> None:
    """Write ``data`` to a temp file, fsync it and rename it onto ``path``: readers see the old file or
    the new one, never a part. The temp file is removed if anything fails (``OSError`` propagates)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=tmp_dir if tmp_dir is not None else (path.parent or "."),
                               prefix=prefix if prefix is not None else path.name, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Best-effort fsync of a folder, so a rename or a new file in it survives a crash; a folder that
    cannot be opened or synced (some filesystems refuse) is passed over."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
