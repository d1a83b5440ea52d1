"""``agenttape keygen``: an Ed25519 checkpoint signing key (PREFIX.key) and its public key (PREFIX.pub)."""

from __future__ import annotations

import argparse
import os

from otel_agenttape.commands.errors import EXIT_OK, CliError


def run(args: argparse.Namespace) -> int:
    """Create the key pair (``integrity.note.Signer.generate``); the secret key file is readable by its owner only."""
    import socket

    from otel_agenttape.integrity.note import NoteError, Signer

    name = args.name or "agenttape." + "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.") or "agenttape"
    try:
        signer = Signer.generate(name)
    except NoteError as exc:
        raise CliError(str(exc)) from None
    key_path, pub_path = args.out + ".key", args.out + ".pub"
    for p in (key_path, pub_path):
        if os.path.exists(p) and not args.force:
            raise CliError(f"{p} exists (use --force to replace it)")
    try:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(signer.skey() + "\n")
        os.chmod(key_path, 0o600)
        with open(pub_path, "w", encoding="utf-8") as fh:
            fh.write(signer.verifier().vkey() + "\n")
    except OSError as exc:
        raise CliError(str(exc)) from None
    print(f"signing key: {key_path} (keep it secret; AGENTTAPE_SIGNING_KEY={key_path})")
    print(f"public key:  {pub_path}")
    print(signer.verifier().vkey())
    return EXIT_OK
