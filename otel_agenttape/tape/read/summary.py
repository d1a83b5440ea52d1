"""A run as one row: ``RunSummary`` (what ``agenttape runs`` lists) and a page of them."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..model import Run


@dataclass
class RunSummary:
    """One run of any source, as the ``runs`` view has it. ``ref`` (``RUN_ID@TRACE_ID``) opens it."""

    ref: str
    run_id: str
    trace_id: str
    span_id: str | None
    agent: str | None
    status: str
    source: str
    session_id: str | None
    service: str | None
    parent_ref: str | None
    start_ns: int
    end_ns: int
    duration_ms: float
    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    errors: int = 0
    tape_id: str | None = None
    models: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    incomplete: bool = False
    status_message: str | None = None
    # cost at read time (tape/read/cost.py): dollars of the priced model calls, None when none had a price
    cost_usd: float | None = None
    priced_calls: int = 0
    unpriced_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RunSummary:
        """From a row of the ``runs`` view."""
        return cls(
            ref=row["ref"], run_id=row["run_id"], trace_id=row["trace_id"], span_id=row["span_id"],
            agent=row["agent"], status=row["status"], source=row["source"], session_id=row["session_id"],
            service=row["service_name"], parent_ref=row["parent_ref"],
            start_ns=int(row["start_time_unix_nano"] or 0), end_ns=int(row["end_time_unix_nano"] or 0),
            duration_ms=float(row["duration_ms"] or 0.0), model_calls=int(row["model_nodes"] or 0),
            tool_calls=int(row["tool_nodes"] or 0), input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"], errors=int(row["errors"] or 0), tape_id=row["tape_id"],
            models=list(row["models"] or []), tools=list(row["tools"] or []), incomplete=bool(row["incomplete"]),
            status_message=row["status_message"],
        )

    @classmethod
    def from_run(cls, run: Run, parent_ref: str | None = None) -> RunSummary:
        """From a rebuilt run (a tree's nodes): the same fields the view computes."""
        models = run.model_nodes
        tools = run.tool_nodes
        return cls(
            ref=run.ref, run_id=run.run_id, trace_id=run.trace_id, span_id=run.span_id, agent=run.agent,
            status=run.status, source=run.source, session_id=run.session_id, service=run.service_name,
            parent_ref=parent_ref, start_ns=run.start_ns, end_ns=run.end_ns, duration_ms=run.duration_ms,
            model_calls=len(models), tool_calls=len(tools), input_tokens=run.usage.input_tokens,
            output_tokens=run.usage.output_tokens,
            errors=sum(1 for n in run.nodes if n.status == "error"),
            tape_id=next((str(n.attributes["agenttape.chain.id"]) for n in run.nodes
                          if n.attributes.get("agenttape.chain.id")), None),
            models=sorted(set(run.models)), tools=sorted({n.tool_name for n in tools if n.tool_name}),
            incomplete=run.status == "incomplete", status_message=run.status_message,
        )


@dataclass
class Page:
    """Runs newest first; ``total`` counts every run matching the filters; ``next_cursor`` continues."""

    runs: list[RunSummary]
    total: int
    next_cursor: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [r.to_dict() for r in self.runs], "total": self.total, "next_cursor": self.next_cursor}


def encode_cursor(start_ns: int, ref: str) -> str:
    """An opaque position after the run (start, ref): runs recorded later never shift it."""
    raw = json.dumps([int(start_ns), ref], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        start, ref = json.loads(raw)
        return int(start), str(ref)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a cursor from runs(): {cursor!r}") from exc
