"""``otel_agenttape.experiment(...)``: the Python face of ``agenttape experiment run``.

Without ``fn`` every selected recorded model call is sent to the candidate model (node level); with
``fn`` the user's agent program runs again on each recorded run's input with the candidate model live and
tools served from the tape (``experiment_program``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from .experiment import Candidate, ExperimentResult, run_experiment


def experiment(name: str, runs_or_dataset: Sequence[str] | str | os.PathLike[str] | None = None,
               fn: Callable[..., Any] | None = None, *, source: Any, model: str | None = None,
               base_url: str | None = None, api_key_env: str | None = None, system_prompt: str | None = None,
               temperature: float | None = None, client: Any = None, provider: str = "openai",
               candidate: Candidate | None = None,
               tools: str = "tape", live: Any = None, mock: Callable[[str, Any], Any] | None = None,
               endpoint: str | None = None, journal: str | os.PathLike[str] | None = None,
               concurrency: int = 4, tape: Any = None, seal: bool = True,
               **filters: Any) -> ExperimentResult:
    """Run experiment ``name`` over ``runs_or_dataset`` (run refs, a dataset file, or None: the runs
    ``filters`` select, as ``Tapes.runs`` takes them) read from ``source``; answers are recorded as runs
    linked to the originals and exported to ``endpoint`` (default: the receiver serving ``source``).
    ``provider="anthropic"`` asks Claude through the Anthropic SDK (``ctx.client`` stays OpenAI-shaped)."""
    if candidate is None:
        if not model:
            raise ValueError("experiment(): give model= (or candidate=)")
        candidate = Candidate(model, base_url=base_url, api_key_env=api_key_env, system_prompt=system_prompt,
                              temperature=temperature, client=client, provider=provider)
    refs: Sequence[str] = ()
    dataset = None
    if isinstance(runs_or_dataset, (str, os.PathLike)):
        dataset = runs_or_dataset
    elif runs_or_dataset is not None:
        refs = [getattr(r, "ref", r) for r in runs_or_dataset]
    if fn is not None:
        from .experiment_program import run_program_experiment

        return run_program_experiment(source, name, fn, candidate, refs=refs, filters=filters, tools=tools,
                                      live=live, mock=mock, endpoint=endpoint, journal=journal, tape=tape, seal=seal)
    return run_experiment(source, name, candidate, refs=refs, filters=filters, dataset=dataset, endpoint=endpoint,
                          journal=journal, concurrency=concurrency, tape=tape, seal=seal)
