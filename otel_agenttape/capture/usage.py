"""Best-effort token usage parsing from any provider's raw payload.

A slot of -1 means "key absent", kept distinct from a real 0 (baseline rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

ABSENT = -1

_INPUT_KEYS = ("prompt_tokens", "promptTokens", "input", "input_tokens", "promptTokenCount")
_OUTPUT_KEYS = ("completion_tokens", "completionTokens", "output", "output_tokens", "candidatesTokenCount")
_USAGE_CONTAINERS = ("usage", "usageMetadata", "usage_metadata", "token_usage", "tokenUsage")


@dataclass(slots=True)
class Usage:
    """Token counts of one model node; ABSENT (-1) where the provider did not say."""

    input_tokens: int = ABSENT
    output_tokens: int = ABSENT
    cache_read_input_tokens: int = ABSENT
    cache_write_input_tokens: int = ABSENT
    reasoning_output_tokens: int = ABSENT

    def merge(self, other: "Usage") -> "Usage":
        """Later present values win; absent slots never erase earlier ones (streamed usage)."""
        if other.input_tokens != ABSENT:
            self.input_tokens = other.input_tokens
        if other.output_tokens != ABSENT:
            self.output_tokens = other.output_tokens
        if other.cache_read_input_tokens != ABSENT:
            self.cache_read_input_tokens = other.cache_read_input_tokens
        if other.cache_write_input_tokens != ABSENT:
            self.cache_write_input_tokens = other.cache_write_input_tokens
        if other.reasoning_output_tokens != ABSENT:
            self.reasoning_output_tokens = other.reasoning_output_tokens
        return self

    def is_empty(self) -> bool:
        return all(getattr(self, n) == ABSENT for n in self.__slots__)


def _int(value: Any) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _find_block(raw: Any, depth: int = 0) -> Mapping[str, Any] | None:
    if (type(raw) is not dict and not isinstance(raw, Mapping)) or depth > 3:
        return None
    for key in _USAGE_CONTAINERS:
        sub = raw.get(key)
        if sub is not None and (type(sub) is dict or isinstance(sub, Mapping)):
            return sub
    if any(k in raw for k in _INPUT_KEYS + _OUTPUT_KEYS):
        return raw
    # Anthropic stream `message_start` wraps the message; Responses API wraps `response`.
    for key in ("message", "response"):
        found = _find_block(raw.get(key), depth + 1)
        if found is not None:
            return found
    return None


# key in a usage block -> (slot, priority); the baseline's first-listed key wins when several appear.
_SLOTS: dict[str, tuple[str, int]] = {}
for _i, _k in enumerate(_INPUT_KEYS):
    _SLOTS[_k] = ("input_tokens", _i)
for _i, _k in enumerate(_OUTPUT_KEYS):
    _SLOTS[_k] = ("output_tokens", _i)
_SLOTS["cache_read_input_tokens"] = ("anthropic_cache_read", 0)
_SLOTS["cache_creation_input_tokens"] = ("anthropic_cache_write", 0)
_SLOTS["cachedContentTokenCount"] = ("cache_read_input_tokens", 0)
_SLOTS["thoughtsTokenCount"] = ("thoughts", 0)
_DETAILS = {
    "prompt_tokens_details": ("cached_tokens", "cache_read_input_tokens"),
    "input_tokens_details": ("cached_tokens", "cache_read_input_tokens"),
    "completion_tokens_details": ("reasoning_tokens", "reasoning_output_tokens"),
    "output_tokens_details": ("reasoning_tokens", "reasoning_output_tokens"),
}


def parse_usage(raw: Any) -> Usage:
    """Parse usage from a raw payload (dict, SDK object already converted) or a usage block."""
    usage = Usage()
    try:
        block = _find_block(raw)
    except Exception:
        return usage
    if block is None:
        return usage
    found: dict[str, tuple[int, int]] = {}
    for key, value in block.items():
        slot = _SLOTS.get(key)
        if slot is not None:
            number = _int(value)
            if number is not None:
                name, rank = slot
                if name not in found or rank < found[name][1]:
                    found[name] = (number, rank)
            continue
        detail = _DETAILS.get(key)
        if detail is not None and isinstance(value, Mapping):
            number = _int(value.get(detail[0]))
            if number is not None:
                found[detail[1]] = (number, 0)
    get = lambda name: found[name][0] if name in found else ABSENT  # noqa: E731
    usage.input_tokens = get("input_tokens")
    usage.output_tokens = get("output_tokens")
    usage.cache_read_input_tokens = get("cache_read_input_tokens")
    usage.reasoning_output_tokens = get("reasoning_output_tokens")
    # Anthropic: input_tokens excludes cache; GenAI input_tokens must include it.
    cache_read, cache_write = get("anthropic_cache_read"), get("anthropic_cache_write")
    if cache_read != ABSENT or cache_write != ABSENT:
        if usage.input_tokens != ABSENT:
            usage.input_tokens += max(cache_read, 0) + max(cache_write, 0)
        usage.cache_read_input_tokens = cache_read
        usage.cache_write_input_tokens = cache_write
    # Gemini: candidatesTokenCount excludes thoughts, GenAI output_tokens includes reasoning.
    thoughts = get("thoughts")
    if thoughts != ABSENT:
        usage.reasoning_output_tokens = thoughts
        if usage.output_tokens != ABSENT and "candidatesTokenCount" in block:
            usage.output_tokens += thoughts
    return usage
