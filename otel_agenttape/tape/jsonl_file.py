"""The lines of a user's JSON-lines file (a reference of expected answers, an experiment's dataset),
each with its line number, so every bad line is an error that names it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def jsonl_rows(path: str | os.PathLike[str], what: str, error: type[Exception] = ValueError
               ) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line; ``error`` for a file that cannot be read
    ("cannot read WHAT PATH: ...") or a line that is not JSON ("PATH:N: not JSON")."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except ValueError:
            raise error(f"{p}:{n}: not JSON") from None
