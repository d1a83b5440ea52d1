"""One recorded call: what was asked, and (once committed) what came back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .keys import ResumeKey

INTENT = "intent"  # written before a side effect starts
COMMITTED = "committed"  # the call finished; result holds its value
FAILED = "failed"  # the call raised; error holds {"type", "message"}

MATCH_CONTENT = "content"  # matched by request hash + occurrence
MATCH_POSITION = "position"  # request hash unknown (rebuilt from foreign spans): matched by position


@dataclass
class Entry:
    tape: str
    kind: str
    request_hash: str
    occurrence: int
    position: int
    request: Any = None
    result: Any = None
    state: str = COMMITTED
    deltas: list[Any] | None = None
    name: str | None = None
    call_id: str | None = None
    idempotency_key: str | None = None
    error: dict[str, str] | None = None
    seq: int = 0
    match: str = MATCH_CONTENT
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> ResumeKey:
        return ResumeKey(self.tape, self.kind, self.request_hash, self.occurrence)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)
