"""The built-in evaluators: checks of a run's output, tools, latency and cost, each an ``Evaluator``.

A parametrised check (a pattern, a budget, a reference file) carries its parameters in its version
(``regex@1-3fa2c9d1``): the same check on the same run adds nothing, another pattern is another check.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .evaluate import EvalRun, EvaluationError, Evaluator, Result, message_text
from .jsonl_file import jsonl_rows

PASS, FAIL = "pass", "fail"


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _verdict(ok: bool, explanation: str, value: float | None = None) -> Result:
    return Result(value=(1.0 if ok else 0.0) if value is None else value, label=PASS if ok else FAIL,
                  explanation=explanation)


def json_valid() -> Evaluator:
    """The run's output parses as JSON (an empty output does not)."""

    def check(run: EvalRun) -> Result:
        text = (run.output or "").strip()
        if not text:
            return _verdict(False, "empty output")
        try:
            json.loads(text)
        except ValueError as exc:
            return _verdict(False, f"not JSON: {exc}")
        return _verdict(True, "valid JSON")

    return Evaluator("json_valid", check, "1", json_valid.__doc__ or "")


def regex(pattern: str) -> Evaluator:
    """The run's output matches the regular expression ``pattern`` (``re.search``)."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--pattern {pattern!r}: not a regular expression: {exc}") from None

    def check(run: EvalRun) -> Result:
        found = compiled.search(run.output or "")
        what = f"matched {found.group(0)[:80]!r}" if found else "not found"
        return _verdict(found is not None, f"/{pattern}/ {what}")

    return Evaluator("regex", check, f"1-{_digest(pattern)}", f"output matches /{pattern}/")


def contains(text: str, *, case_sensitive: bool = False) -> Evaluator:
    """The run's output contains ``text`` (case-insensitive unless asked)."""
    if not text:
        raise ValueError("contains: give the text to look for (--pattern TEXT)")
    wanted = text if case_sensitive else text.casefold()

    def check(run: EvalRun) -> Result:
        out = run.output or ""
        ok = wanted in (out if case_sensitive else out.casefold())
        return _verdict(ok, f"{text!r} {'found' if ok else 'not found'}")

    return Evaluator("contains", check, f"1-{_digest(text, case_sensitive)}", f"output contains {text!r}")


def _normalise_input(value: Any) -> str:
    if isinstance(value, list):  # chat messages: the last user message
        users = [m for m in value if isinstance(m, dict) and m.get("role") == "user"]
        return message_text(users[-1]).strip() if users else ""
    return message_text(value).strip() if isinstance(value, dict) else str(value).strip()


def load_reference(path: str | os.PathLike[str]) -> dict[str, str]:
    """A JSONL file of ``{"input": ..., "expected": ...}`` lines: input (text, or chat messages whose last
    user message is taken) -> expected output. A bad line is an error naming it."""
    p = Path(path)
    out: dict[str, str] = {}
    for n, row in jsonl_rows(p, "reference file"):
        if not isinstance(row, dict) or "input" not in row or "expected" not in row:
            raise ValueError(f"{p}:{n}: needs \"input\" and \"expected\"")
        expected = row["expected"]
        out[_normalise_input(row["input"])] = expected if isinstance(expected, str) else json.dumps(expected)
    if not out:
        raise ValueError(f"{p}: no reference lines")
    return out


def exact_match(reference: str | os.PathLike[str] | dict[str, str]) -> Evaluator:
    """The run's output is exactly the expected output of its input in the reference (surrounding
    whitespace aside). A run whose input the reference does not have is not evaluated."""
    table = load_reference(reference) if not isinstance(reference, dict) else dict(reference)

    def check(run: EvalRun) -> Result | None:
        expected = table.get(run.input_text.strip())
        if expected is None:
            return None
        got = (run.output or "").strip()
        ok = got == expected.strip()
        return _verdict(ok, "matches the reference" if ok else f"expected {expected[:200]!r}, got {got[:200]!r}")

    return Evaluator("exact_match", check, f"1-{_digest(sorted(table.items()))}", "output equals the reference")


def tool_error_rate(max_rate: float = 0.0) -> Evaluator:
    """The share of the run's tool calls that failed (value); pass when it is at most ``max_rate``. A run
    without tool calls has rate 0."""

    def check(run: EvalRun) -> Result:
        tools = run.tool_nodes
        failed = sum(1 for n in tools if n.status == "error" or n.tool_error)
        rate = failed / len(tools) if tools else 0.0
        return _verdict(rate <= max_rate, f"{failed} of {len(tools)} tool calls failed", value=rate)

    return Evaluator("tool_error_rate", check, "1" if not max_rate else f"1-{_digest(max_rate)}",
                     "share of tool calls that failed")


def latency_budget(budget_ms: float) -> Evaluator:
    """The run took at most ``budget_ms`` milliseconds (value: its duration in ms)."""
    if not budget_ms or budget_ms <= 0:
        raise ValueError("--budget-ms: give a positive number of milliseconds")

    def check(run: EvalRun) -> Result:
        took = float(run.duration_ms)
        return _verdict(took <= budget_ms, f"{took:.0f} ms of a {budget_ms:g} ms budget", value=took)

    return Evaluator("latency_budget", check, f"1-{_digest(float(budget_ms))}", f"duration <= {budget_ms:g} ms")


def cost_budget(budget_usd: float) -> Evaluator:
    """The run's model calls cost at most ``budget_usd`` dollars (value: its cost). A run whose cost is not
    known (calls without a price) and not already over the budget records ``error.type`` cost_unknown."""
    if budget_usd is None or budget_usd < 0:
        raise ValueError("--budget-usd: give a number of dollars, 0 or more")

    def check(run: EvalRun) -> Result:
        usd, unpriced = run.cost_usd, run.unpriced_calls
        if usd is not None and usd > budget_usd:
            extra = f" (+{unpriced} calls without a price)" if unpriced else ""
            return _verdict(False, f"${usd:.6g}{extra} over a ${budget_usd:g} budget", value=usd)
        if unpriced:
            raise EvaluationError("cost_unknown", f"{unpriced} model call{'s' if unpriced != 1 else ''} without a "
                                                  "price (--prices FILE gives models a price)")
        usd = usd or 0.0
        return _verdict(True, f"${usd:.6g} of a ${budget_usd:g} budget", value=usd)

    return Evaluator("cost_budget", check, f"1-{_digest(float(budget_usd))}", f"cost <= ${budget_usd:g}")


BUILTINS: dict[str, str] = {
    "json_valid": "the output parses as JSON",
    "regex": "the output matches --pattern RE",
    "contains": "the output contains --pattern TEXT (case-insensitive)",
    "exact_match": "the output equals the expected output of its input in --reference FILE (JSONL)",
    "tool_error_rate": "share of tool calls that failed (pass at 0, or at most --max-rate)",
    "latency_budget": "the run took at most --budget-ms N",
    "cost_budget": "the run cost at most --budget-usd X",
    "llm_judge": "an OpenAI-compatible model grades the run by --rubric FILE (--judge-model, --judge-base-url)",
}


def builtin(name: str, *, pattern: str | None = None, reference: str | None = None, budget_ms: float | None = None,
            budget_usd: float | None = None, max_rate: float | None = None, judge: dict[str, Any] | None = None
            ) -> Evaluator:
    """A built-in evaluator by name with its options (what ``agenttape eval NAME`` builds)."""
    makers: dict[str, Callable[[], Evaluator]] = {
        "json_valid": json_valid,
        "regex": lambda: regex(_need(pattern, "regex", "--pattern RE")),
        "contains": lambda: contains(_need(pattern, "contains", "--pattern TEXT")),
        "exact_match": lambda: exact_match(_need(reference, "exact_match", "--reference FILE")),
        "tool_error_rate": lambda: tool_error_rate(max_rate or 0.0),
        "latency_budget": lambda: latency_budget(_need(budget_ms, "latency_budget", "--budget-ms N")),
        "cost_budget": lambda: cost_budget(_need(budget_usd, "cost_budget", "--budget-usd X")),
    }
    if name == "llm_judge":
        from .judge import llm_judge

        return llm_judge(**(judge or {}))
    if name not in makers:
        raise ValueError(f"no built-in evaluator {name!r} (built in: {', '.join(BUILTINS)}; "
                         "or give MODULE:FUNCTION)")
    return makers[name]()


def _need(value: Any, name: str, flag: str) -> Any:
    if value is None or value == "":
        raise ValueError(f"{name}: give {flag}")
    return value
