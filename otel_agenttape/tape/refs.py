"""Run refs: ``RUN_ID@TRACE_ID`` names one run; a bare run id or a trace id is resolved to one.

A run id is unique only together with its trace: a script run twice under one run id is two runs.
A bare id that names runs in several traces is refused (``AmbiguousRunError`` lists the candidates),
never merged and never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .load import Reader, Windows, run_trace_window, run_traces, span_traces, trace_windows

TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
SPAN_ID = re.compile(r"^[0-9a-f]{16}$")


class RunNotFound(LookupError):
    """No run with this ref in the store."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run not found: {run_id}")
        self.run_id = run_id


class AmbiguousRunError(LookupError):
    """A bare run id names runs in several traces; ``candidates`` are their refs, newest first."""

    def __init__(self, run_id: str, candidates: list[str]) -> None:
        listed = ", ".join(candidates)
        super().__init__(f"run id {run_id} names {len(candidates)} runs (one per trace): {listed}; "
                         "give one as RUN_ID@TRACE_ID")
        self.run_id = run_id
        self.candidates = candidates


@dataclass(frozen=True)
class Resolved:
    """Where a ref points: run ``key`` in ``trace_id`` (``key`` None: the trace's root run)."""

    key: str | None
    trace_id: str
    windows: Windows

    @property
    def ref(self) -> str:
        return f"{self.key or self.trace_id}@{self.trace_id}"


def make_ref(run_id: str, trace_id: str) -> str:
    return f"{run_id}@{trace_id}"


def split_ref(ref: str) -> tuple[str, str | None]:
    """``RUN_ID@TRACE_ID`` -> (run id, trace id); anything else -> (ref, None)."""
    run_id, sep, trace_id = ref.rpartition("@")
    if sep and run_id and TRACE_ID.match(trace_id):
        return run_id, trace_id
    return ref, None


def _candidates(windows: Windows, run_id: str) -> list[str]:
    order = sorted(windows, key=lambda t: -(windows[t] or (0, 0))[0])
    return [make_ref(run_id, t) for t in order]


def resolve(reader: Reader, ref: str) -> Resolved:
    """The one run a ref names; ``RunNotFound`` or ``AmbiguousRunError`` otherwise."""
    ref = ref.strip()
    run_id, trace_id = split_ref(ref)
    if trace_id is not None:
        if run_id != trace_id:  # the run index has the pair: its window, as a bare run id would get
            windows = run_trace_window(reader, run_id, trace_id)
            if windows:
                return Resolved(run_id, trace_id, windows)
        windows = trace_windows(reader, [trace_id])
        if not windows:
            raise RunNotFound(ref)
        return Resolved(None if run_id == trace_id else run_id, trace_id, windows)
    windows = run_traces(reader, ref)
    if len(windows) > 1:
        raise AmbiguousRunError(ref, _candidates(windows, ref))
    if windows:
        (only,) = windows
        return Resolved(ref, only, {only: windows[only]})
    if TRACE_ID.match(ref):
        windows = trace_windows(reader, [ref])
        if windows:
            return Resolved(None, ref, windows)
    if SPAN_ID.match(ref):
        windows = span_traces(reader, ref)
        if len(windows) > 1:
            raise AmbiguousRunError(ref, _candidates(windows, ref))
        if windows:
            (only,) = windows
            return Resolved(ref, only, windows)
    raise RunNotFound(ref)
