"""``--key`` for ``verify``, ``prove`` and ``verify-proof``: trusted public keys, as files or as key text."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from otel_agenttape.commands.errors import CliError


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.endswith((".pub", ".key"))


def parse_key(arg: str) -> Any:
    """``--key``: a file holding a verifier key, or the key text itself (``name+hash+base64``)."""
    from otel_agenttape.integrity import Verifier
    from otel_agenttape.integrity.note import NoteError

    if os.path.exists(arg):
        try:
            with open(arg, encoding="utf-8") as fh:
                text = fh.read().strip()
        except UnicodeDecodeError:
            raise CliError(f"bad --key {arg}: not a text key file") from None
        except OSError as exc:
            raise CliError(f"bad --key {arg}: {exc.strerror or exc}") from None
    else:
        text = arg
    try:
        return Verifier.parse(text)
    except NoteError as exc:
        if text is arg and _looks_like_path(arg):  # key names and base64 hold "/" too: parse first
            raise CliError(f"bad --key {arg}: no such file") from None
        raise CliError(f"bad --key {arg}: {exc}") from None


def verifiers(keys: Sequence[str] | None) -> list[Any]:
    """Every ``--key`` given, parsed (none: an empty list)."""
    return [parse_key(k) for k in keys or ()]
