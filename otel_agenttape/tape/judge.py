"""An LLM judge: a model on any OpenAI-compatible endpoint grades a run by a rubric.

The judge is asked for a JSON object ``{"score": 0..1, "label": "...", "explanation": "..."}`` (a strict
JSON schema as ``response_format``) and its answer is parsed strictly: anything else (not JSON, missing or
extra keys, a score out of range) is an ``invalid_output`` error, a slow answer a ``timeout``, an HTTP
failure ``http_<status>``. Errors are recorded as ``error.type`` on the evaluation, never as a score.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from .evaluate import EvalRun, EvaluationError, Evaluator, Result

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT = 30.0
MAX_TEXT = 20_000  # characters of the run's input and output shown to the judge

SCHEMA: dict[str, Any] = {
    "name": "evaluation",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "label": {"type": "string"},
            "explanation": {"type": "string"},
        },
        "required": ["score", "label", "explanation"],
        "additionalProperties": False,
    },
}

INSTRUCTIONS = (
    "You grade one run of an AI agent by the rubric below. Answer with one JSON object and nothing else: "
    '{"score": a number from 0 (worst) to 1 (best), "label": a one-word verdict, "explanation": one or two '
    "sentences}.\n\nRubric:\n"
)


def parse_verdict(content: Any) -> Result:
    """The judge's message content as a ``Result``; anything but the asked-for object is ``invalid_output``."""
    if not isinstance(content, str) or not content.strip():
        raise EvaluationError("invalid_output", "the judge answered no text")
    try:
        doc = json.loads(content)
    except ValueError:
        raise EvaluationError("invalid_output", f"not JSON: {content[:200]!r}") from None
    if not isinstance(doc, dict):
        raise EvaluationError("invalid_output", f"not a JSON object: {content[:200]!r}")
    keys = set(doc)
    if keys != {"score", "label", "explanation"}:
        raise EvaluationError("invalid_output", f"keys {sorted(keys)}, expected score, label, explanation")
    score, label, explanation = doc["score"], doc["label"], doc["explanation"]
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score) \
            or not 0 <= score <= 1:
        raise EvaluationError("invalid_output", f"score {score!r} is not a number from 0 to 1")
    if not isinstance(label, str) or not isinstance(explanation, str):
        raise EvaluationError("invalid_output", "label and explanation must be strings")
    return Result(value=float(score), label=label.strip() or None, explanation=explanation.strip() or None)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"... [{len(text) - MAX_TEXT} more characters]"


def run_text(run: EvalRun) -> str:
    """What the judge reads of a run: its input messages, the tools it called and its final output."""
    messages = [{"role": m.role, "content": m.content()} for m in run.input]
    tools = [{"name": t.name, "arguments": t.arguments, "result": t.result, "error": t.error} for t in run.run.tools]
    parts = [f"Agent: {run.agent or 'unknown'}",
             "Input:\n" + _clip(json.dumps(messages, ensure_ascii=False, default=str))]
    if tools:
        parts.append("Tool calls:\n" + _clip(json.dumps(tools, ensure_ascii=False, default=str)))
    parts.append("Final output:\n" + _clip(run.output or ""))
    return "\n\n".join(parts)


def llm_judge(model: str | None = None, *, rubric: str | os.PathLike[str] | None = None, base_url: str | None = None,
              api_key_env: str | None = None, timeout: float = DEFAULT_TIMEOUT, name: str = "llm_judge",
              rubric_text: str | None = None, client: Any = None) -> Evaluator:
    """A judge evaluator: ``model`` at ``base_url`` (any OpenAI-compatible ``/chat/completions``; default
    the OpenAI API) grades each run by ``rubric`` (a text file) or ``rubric_text``, with the API key from
    ``$api_key_env`` (default ``OPENAI_API_KEY``). The version names the model and the rubric's digest, so
    another model or rubric is another evaluator. ``client``: an ``httpx.Client`` to send with."""
    if not model:
        raise ValueError("llm_judge: give the judge model (--judge-model)")
    if rubric_text is None:
        if rubric is None:
            raise ValueError("llm_judge: give a rubric file (--rubric FILE)")
        try:
            rubric_text = Path(rubric).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read rubric {rubric}: {exc.strerror or exc}") from None
    if not rubric_text.strip():
        raise ValueError("llm_judge: the rubric is empty")
    key_var = api_key_env or "OPENAI_API_KEY"
    key = os.environ.get(key_var)
    if api_key_env and not key:
        raise ValueError(f"llm_judge: ${api_key_env} is not set")
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx is in the judge extra
        raise ValueError("llm_judge needs httpx: pip install 'otel-agenttape[judge]'") from None
    url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"
    http = client or httpx.Client(timeout=httpx.Timeout(timeout), trust_env=False)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    system = INSTRUCTIONS + rubric_text.strip()

    def grade(run: EvalRun) -> Result:
        body = {"model": model, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": SCHEMA},
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": run_text(run)}]}
        try:
            response = http.post(url, json=body, headers=headers)
        except httpx.TimeoutException:
            raise EvaluationError("timeout", f"no answer from {url} within {timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise EvaluationError("connect_error", f"{url}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise EvaluationError(f"http_{response.status_code}", response.text[:200])
        try:
            doc = response.json()
            message = doc["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise EvaluationError("invalid_output", f"not a chat completion: {response.text[:200]!r}") from None
        if not isinstance(message, dict):
            raise EvaluationError("invalid_output", "not a chat completion message")
        if message.get("refusal"):
            raise EvaluationError("refused", str(message["refusal"])[:200])
        return parse_verdict(message.get("content"))

    digest = hashlib.sha256(rubric_text.encode("utf-8")).hexdigest()[:8]
    return Evaluator(name, grade, f"{model}-{digest}", f"{model} grades by the rubric ({digest})")
