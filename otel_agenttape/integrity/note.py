"""C2SP signed notes (c2sp.org/signed-note) with Ed25519 keys from ``cryptography``.

A note is UTF-8 text ending in a newline, a blank line, then signature lines
``— <key name> base64(key id || signature)``. Key id = ``SHA-256(name || 0x0A || 0x01 || pubkey)[:4]``.
Key strings use the Go ``sumdb/note`` forms: verifier ``<name>+<hex id>+base64(0x01 || pubkey)`` and
signer ``PRIVATE+KEY+<name>+<hex id>+base64(0x01 || seed)``. Opening a note ignores signatures by
unknown keys and rejects the note unless a known key verifies it.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ALG_ED25519 = 0x01
EM_DASH = "\u2014"
MAX_SIGNATURES = 100


class NoteError(ValueError):
    """A malformed note or key, or a note that no trusted key verifies."""


def key_id(name: str, alg: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([alg]) + public).digest()[:4]


def _check_name(name: str) -> None:
    if not name or "+" in name or any(c.isspace() for c in name):
        raise NoteError(f"invalid key name {name!r}")


@dataclass(frozen=True)
class Verifier:
    name: str
    id: bytes
    public_key: Ed25519PublicKey

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        try:
            name, hex_id, data = vkey.strip().split("+", 2)
            raw = base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise NoteError(f"malformed verifier key: {exc}") from exc
        _check_name(name)
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise NoteError("unsupported verifier key type (want Ed25519)")
        kid = key_id(name, ALG_ED25519, raw[1:])
        if len(hex_id) != 8 or kid.hex() != hex_id.lower():
            raise NoteError("verifier key id does not match the key")
        return cls(name, kid, Ed25519PublicKey.from_public_bytes(raw[1:]))

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            self.public_key.verify(signature, message)
            return True
        except InvalidSignature:
            return False

    def vkey(self) -> str:
        raw = self.public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
        return f"{self.name}+{self.id.hex()}+{base64.b64encode(bytes([ALG_ED25519]) + raw).decode()}"


@dataclass(frozen=True)
class Signer:
    name: str
    id: bytes
    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls, name: str) -> Signer:
        _check_name(name)
        key = Ed25519PrivateKey.generate()
        pub = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return cls(name, key_id(name, ALG_ED25519, pub), key)

    @classmethod
    def parse(cls, skey: str) -> Signer:
        parts = skey.strip().split("+", 4)
        if len(parts) != 5 or parts[0] != "PRIVATE" or parts[1] != "KEY":
            raise NoteError("malformed signer key")
        _, _, name, hex_id, data = parts
        _check_name(name)
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise NoteError(f"malformed signer key: {exc}") from exc
        if len(raw) != 33 or raw[0] != ALG_ED25519:
            raise NoteError("unsupported signer key type (want Ed25519)")
        key = Ed25519PrivateKey.from_private_bytes(raw[1:])
        pub = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        kid = key_id(name, ALG_ED25519, pub)
        if kid.hex() != hex_id.lower():
            raise NoteError("signer key id does not match the key")
        return cls(name, kid, key)

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)

    def skey(self) -> str:
        from cryptography.hazmat.primitives.serialization import (
            NoEncryption,
            PrivateFormat,
        )

        seed = self.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return f"PRIVATE+KEY+{self.name}+{self.id.hex()}+{base64.b64encode(bytes([ALG_ED25519]) + seed).decode()}"

    def verifier(self) -> Verifier:
        return Verifier(self.name, self.id, self.private_key.public_key())


def sign_note(text: str, signers: Sequence[Signer]) -> str:
    """Sign ``text`` (which must end in a newline) with each signer."""
    if not text.endswith("\n"):
        raise NoteError("note text must end with a newline")
    msg = text.encode("utf-8")
    lines = [
        f"{EM_DASH} {s.name} {base64.b64encode(s.id + s.sign(msg)).decode()}\n" for s in signers
    ]
    return text + "\n" + "".join(lines)


@dataclass(frozen=True)
class Signature:
    name: str
    id: bytes
    signature: bytes


@dataclass(frozen=True)
class OpenedNote:
    text: str
    verified: tuple[str, ...]  # names of the trusted keys whose signatures verified
    signatures: tuple[Signature, ...]


def split_note(note: str) -> tuple[str, list[Signature]]:
    """Split a signed note into its text and parsed signature lines (nothing verified)."""
    idx = note.rfind("\n\n")
    if idx < 0 or not note.endswith("\n"):
        raise NoteError("malformed note: no signature block")
    text = note[: idx + 1]
    sigs: list[Signature] = []
    for line in note[idx + 2 : -1].split("\n"):
        if not line.startswith(EM_DASH + " "):
            raise NoteError("malformed signature line")
        try:
            name, b64 = line[2:].split(" ")
            raw = base64.b64decode(b64, validate=True)
        except ValueError as exc:
            raise NoteError("malformed signature line") from exc
        if len(raw) < 5:
            raise NoteError("signature too short")
        sigs.append(Signature(name, raw[:4], raw[4:]))
    if not sigs or len(sigs) > MAX_SIGNATURES:
        raise NoteError("wrong number of signatures")
    return text, sigs


def open_note(note: str, verifiers: Iterable[Verifier]) -> OpenedNote:
    """Verify ``note`` against trusted keys; raise ``NoteError`` unless at least one verifies."""
    text, sigs = split_note(note)
    msg = text.encode("utf-8")
    known = {(v.name, v.id): v for v in verifiers}
    ok: list[str] = []
    for sig in sigs:
        v = known.get((sig.name, sig.id))
        if v is None:
            continue  # unknown keys are ignored
        if not v.verify(msg, sig.signature):
            raise NoteError(f"invalid signature by {sig.name}")
        ok.append(sig.name)
    if not ok:
        raise NoteError("no trusted key signed the note")
    return OpenedNote(text, tuple(ok), tuple(sigs))
