"""C2SP tlog-checkpoint bodies for tapes (c2sp.org/tlog-checkpoint).

Body: ``<origin>\\n<size>\\n<base64 root>\\n`` then extension lines. A tape's origin is
``agenttape.dev/tape/<chain id>`` (percent-encoded, so it holds no space or ``+``), with
``/epoch/<n>`` appended for epochs after the first. Extension lines used here:
``chain <hex head>`` (the linear chain's hash at ``size - 1``, or the genesis) and, in the signed
size-0 checkpoint that opens a restored epoch, ``restore <origin> <size> <base64 root>`` naming the
last checkpoint of the previous epoch.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import orjson

ORIGIN_PREFIX = "agenttape.dev/tape/"


class CheckpointError(ValueError):
    pass


def origin_for(chain_id: str, epoch: int = 0) -> str:
    base = ORIGIN_PREFIX + quote(chain_id, safe="")
    return base if epoch == 0 else f"{base}/epoch/{epoch}"


def parse_origin(origin: str) -> tuple[str, int]:
    """``(chain_id, epoch)`` of a tape origin."""
    if not origin.startswith(ORIGIN_PREFIX):
        raise CheckpointError(f"not a tape origin: {origin!r}")
    rest = origin[len(ORIGIN_PREFIX):]
    epoch = 0
    if "/epoch/" in rest:
        rest, _, e = rest.partition("/epoch/")
        if not e.isdigit():
            raise CheckpointError(f"bad epoch in origin {origin!r}")
        epoch = int(e)
    return unquote(rest), epoch


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = field(default=())

    def body(self) -> str:
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode()]
        return "\n".join([*lines, *self.extensions]) + "\n"

    def extension(self, keyword: str) -> str | None:
        for line in self.extensions:
            if line.startswith(keyword + " "):
                return line[len(keyword) + 1:]
        return None

    @property
    def chain_head(self) -> str | None:
        return self.extension("chain")

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        if not text.endswith("\n"):
            raise CheckpointError("checkpoint must end with a newline")
        lines = text[:-1].split("\n")
        if len(lines) < 3:
            raise CheckpointError("checkpoint needs origin, size and root")
        origin, size_s, root_s, *ext = lines
        if not origin or not size_s.isdigit() or (size_s != "0" and size_s.startswith("0")):
            raise CheckpointError("bad checkpoint origin or size")
        try:
            root = base64.b64decode(root_s, validate=True)
        except ValueError as exc:
            raise CheckpointError("bad checkpoint root") from exc
        if len(root) != 32 or any(not e for e in ext):
            raise CheckpointError("bad checkpoint root or empty extension line")
        return cls(origin, int(size_s), root, tuple(ext))


def read_checkpoint_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of a local checkpoint file (JSON lines with a ``note``); torn lines are skipped."""
    out = []
    with open(path, "rb") as fh:
        for line in fh:
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("note"), str):
                out.append(rec)
    return out
