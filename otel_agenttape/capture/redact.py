"""Redaction of content before it leaves the process (and before sealing, so the chain covers
what was actually exported)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Pattern, Sequence, Union

from otel_agenttape import semconv
from otel_agenttape.capture.stats import CaptureStats

REDACTED = "[REDACTED]"
REDACTION_FAILED = "[REDACTION FAILED]"

# Built-in patterns: provider API keys, bearer tokens, e-mail addresses.
BUILTIN_PATTERNS: dict[str, Pattern[str]] = {
    "api_key": re.compile(
        r"\b(?:sk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{16,}"
        r"|AKIA[0-9A-Z]{16}"
        r"|AIza[0-9A-Za-z_\-]{35}"
        r"|gh[pousr]_[A-Za-z0-9]{36,}"
        r"|xox[abprs]-[A-Za-z0-9\-]{10,})"
    ),
    "bearer": re.compile(r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{8,}=*"),
    "email": re.compile(r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}\b"),
}

RedactSpec = Union[None, bool, str, Callable[[str], str], Pattern[str], Sequence[Any]]


class Redactor:
    """Applies patterns and callables to a content string. Failures are counted, never raised:
    a failing redactor replaces the value with REDACTION_FAILED rather than leak it."""

    def __init__(self, rules: Sequence[Callable[[str], str] | Pattern[str]], stats: CaptureStats | None = None):
        self._rules = list(rules)
        self.stats = stats or CaptureStats()

    def __call__(self, text: str) -> str:
        if not text:
            return text
        try:
            out = text
            for rule in self._rules:
                if isinstance(rule, re.Pattern):
                    out = rule.sub(REDACTED, out)
                else:
                    out = rule(out)
                    if not isinstance(out, str):
                        out = str(out)
        except Exception:
            self.stats.incr("redactor_errors")
            return REDACTION_FAILED
        if out != text:
            self.stats.incr("redactions")
        return out


def build_redactor(spec: RedactSpec, stats: CaptureStats | None = None) -> Redactor | None:
    """``redact=`` option -> Redactor. None/False: off. True or "builtin": the built-in patterns.
    A callable or compiled pattern, a pattern name, or a list mixing them."""
    if spec is None or spec is False:
        return None
    items: Iterable[Any]
    if spec is True or isinstance(spec, (str, re.Pattern)) or callable(spec):
        items = [spec]
    else:
        items = list(spec)
    rules: list[Callable[[str], str] | Pattern[str]] = []
    for item in items:
        if item is True or item == "builtin":
            rules.extend(BUILTIN_PATTERNS.values())
        elif isinstance(item, str):
            if item in BUILTIN_PATTERNS:
                rules.append(BUILTIN_PATTERNS[item])
            else:
                rules.append(re.compile(item))
        elif isinstance(item, re.Pattern) or callable(item):
            rules.append(item)
        else:
            raise TypeError(f"unsupported redact rule: {item!r}")
    return Redactor(rules, stats) if rules else None


# The attributes redaction applies to on other instrumentations' spans and on log records (ours are
# redacted at the source), by key or key prefix.
REDACT_KEYS = frozenset({
    semconv.GEN_AI_INPUT_MESSAGES, semconv.GEN_AI_OUTPUT_MESSAGES, semconv.GEN_AI_SYSTEM_INSTRUCTIONS,
    semconv.GEN_AI_TOOL_CALL_ARGUMENTS, semconv.GEN_AI_TOOL_CALL_RESULT, semconv.MODEL_RAW_OUTPUT,
    semconv.MODEL_OUTPUT_TEXT, semconv.MODEL_REASONING, semconv.TOOL_ERROR, semconv.OI_INPUT_VALUE,
    semconv.OI_OUTPUT_VALUE, semconv.TRACELOOP_ENTITY_INPUT, semconv.TRACELOOP_ENTITY_OUTPUT,
})
REDACT_PREFIXES = (semconv.LEGACY_PROMPT_PREFIX, semconv.LEGACY_COMPLETION_PREFIX, semconv.OI_LLM_INPUT_MESSAGES,
                   semconv.OI_LLM_OUTPUT_MESSAGES)


def redact_value(value: Any, redactor: Callable[[str], str]) -> Any:
    """``value`` with every string in it redacted (lists, tuples and maps walked)."""
    if isinstance(value, str):
        return redactor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v, redactor) for v in value)
    if isinstance(value, Mapping):
        return {k: redact_value(v, redactor) for k, v in value.items()}
    return value
