"""Resume keys: tape + sha256 of the canonical request + occurrence ordinal.

A pure content key skips a repeated identical side effect; a pure position key breaks when parallel
calls finish in another order. The occurrence ordinal among identical requests fixes the first, and
looking up by content fixes the second.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

MODEL = "model"
TOOL = "tool"
VALUE = "value"

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _default(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if callable(dump):  # pydantic models (SDK request/response types)
        return dump(mode="json", exclude_unset=True)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=lambda v: orjson.dumps(v, default=_default, option=_OPTS))
    if hasattr(obj, "__dict__"):
        return {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    raise TypeError(f"cannot canonicalize {type(obj).__name__}")


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, compact) of a request or result."""
    return orjson.dumps(value, default=_default, option=_OPTS)


def to_jsonable(value: Any) -> Any:
    """Plain JSON value (dicts, lists, str, numbers) of anything ``canonical_json`` accepts."""
    return orjson.loads(canonical_json(value))


def request_hash(request: Any) -> str:
    return hashlib.sha256(canonical_json(request)).hexdigest()


def tool_request(name: str, arguments: Any) -> dict[str, Any]:
    """The hashed form of a tool call: its name and canonical arguments.

    Arguments given as JSON text are parsed, so a call recorded as text (the
    ``gen_ai.tool.call.arguments`` attribute) hashes like the live dict.
    """
    if isinstance(arguments, (str, bytes)):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            pass
    return {"name": name, "arguments": to_jsonable(arguments)}


@dataclass(frozen=True)
class ResumeKey:
    tape: str
    kind: str
    request_hash: str
    occurrence: int

    def __str__(self) -> str:
        return f"{self.tape}|{self.kind}|{self.request_hash}|{self.occurrence}"

    @classmethod
    def parse(cls, text: str) -> ResumeKey:
        tape, kind, digest, occ = text.rsplit("|", 3)
        return cls(tape, kind, digest, int(occ))

    def idempotency_key(self) -> str:
        """Stable across retries of this call, unique among calls: what a callee deduplicates on."""
        return hashlib.sha256(str(self).encode("utf-8")).hexdigest()[:32]


def request_diff(recorded: Any, current: Any) -> str:
    """Unified diff of two requests rendered as indented, sorted JSON."""
    opt = _OPTS | orjson.OPT_INDENT_2

    def lines(v: Any) -> list[str]:
        return orjson.dumps(v, default=_default, option=opt).decode("utf-8").splitlines()

    return "\n".join(
        difflib.unified_diff(lines(recorded), lines(current), "recorded", "current", lineterm="")
    )


# --- calls matched by position -----------------------------------------------------------------
# A model span recorded without a resume key (plain capture, other instrumentations) has no request
# hash to match; its entry is replayed by position. What it does say about its request (the model
# and the messages, in the GenAI conventions' form) is still compared with the live request, so a
# changed prompt or model raises ``DivergenceError`` instead of replaying another call's answer.

_REQUEST_MODEL = "gen_ai.request.model"
_INPUT_MESSAGES = "gen_ai.input.messages"


def _last_user_text(messages: Any) -> str | None:
    """The text of the last user message: OpenAI/Anthropic request messages or GenAI ``parts``."""
    if not isinstance(messages, list):
        return None
    for msg in reversed(messages):
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        content = msg.get("content", msg.get("parts"))
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [p.get("content", p.get("text")) for p in content if isinstance(p, dict)]
            return "".join(t for t in texts if isinstance(t, str))
        return None
    return None


def position_conflict(recorded: Any, current: Any) -> str | None:
    """Why a live request is not the recorded position-matched one (another model, another last user
    message), or None when nothing the recording says contradicts it."""
    if not isinstance(recorded, dict) or not isinstance(current, dict):
        return None
    model = recorded.get(_REQUEST_MODEL)
    live_model = current.get("model")
    if isinstance(model, str) and isinstance(live_model, str) and model != live_model:
        return f"recorded model {model!r}, now {live_model!r}"
    was = _last_user_text(recorded.get(_INPUT_MESSAGES))
    now = _last_user_text(current.get("messages"))
    if was is not None and now is not None and was != now:
        return f"recorded last user message {was[:80]!r}, now {now[:80]!r}"
    return None
