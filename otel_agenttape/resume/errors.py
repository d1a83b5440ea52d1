"""Errors a resumed run raises instead of silently doing the wrong thing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ResumeError(Exception):
    """Base class of every resume error."""


class DivergenceError(ResumeError):
    """The resumed run asked something different from what was recorded at the same position.

    Like Temporal's NonDeterminismError or DBOS's unexpected-step error, but carrying the diff of the
    recorded and current request so the cause is visible.
    """

    def __init__(self, kind: str, position: int, recorded: Any, current: Any, diff: str) -> None:
        self.kind = kind
        self.position = position
        self.recorded = recorded
        self.current = current
        self.diff = diff
        super().__init__(
            f"{kind} call #{position} differs from the recorded run (recorded vs current):\n{diff}"
        )


class UnrecordedCallError(ResumeError):
    """Replay-only mode met a call that the tape does not hold."""

    def __init__(self, kind: str, position: int, request: Any) -> None:
        self.kind = kind
        self.position = position
        self.request = request
        super().__init__(f"replay-only: unrecorded {kind} call #{position}")


@dataclass(frozen=True)
class InDoubtReport:
    """An intent without a commit: the side effect may or may not have happened."""

    key: str
    tool: str | None
    arguments: Any
    idempotency_key: str | None
    policy: str


class InDoubtError(ResumeError):
    """A tool's side effect is in doubt and the policy says not to guess."""

    def __init__(self, report: InDoubtReport) -> None:
        self.report = report
        super().__init__(
            f"tool {report.tool!r} is in doubt (intent recorded, no commit): key={report.key} "
            f"idempotency_key={report.idempotency_key} policy={report.policy}"
        )


class RecordedToolError(ResumeError, RuntimeError):
    """A tool failure recorded in the original run, raised again instead of calling the tool.

    The one class for both ways a run is driven again: a resumed run (``ResumableToolExecutor``) raises
    it with the recorded ``error_type`` and ``message``, and ``str()`` reads ``"Type: message"``; replay
    from a tape (``otel_agenttape.tape.recorded_failure``) raises a subclass named after the recorded
    type, whose ``str()`` is the message alone, so ``f"{type(e).__name__}: {e}"`` is the recorded text.
    ``tool`` is the tool's name where the recording has it.
    """

    def __init__(self, error_type: str, message: str, *, tool: str | None = None) -> None:
        self.error_type = error_type
        self.message = message
        self.tool = tool
        super().__init__(message if type(self).__name__ == error_type else f"{error_type}: {message}")
