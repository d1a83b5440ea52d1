"""The session snapshot: what an agent session needs to survive a restart and continue its tape.

A snapshot holds the session's memory (any JSON value), its event log, the results of compacting
that log, and the tape position of its last run (run id, trace/span ids and, when sealing is on,
the chain head). Stores persist it as one JSON document; ``to_dict``/``from_dict`` are the format.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from otel_agenttape import semconv
from otel_agenttape.sessions.ids import validate_session_id

SNAPSHOT_FORMAT = 1
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")


@dataclass
class TapePosition:
    """Where a session's tape stopped: enough to link the next run to the last one."""

    run_id: str | None = None
    trace_id: str | None = None  # 32 lowercase hex, of the last run's span
    span_id: str | None = None  # 16 lowercase hex, the last run's (invoke_agent) span
    trace_flags: int = 1
    chain_id: str | None = None
    chain_seq: int | None = None
    chain_hash: str | None = None

    def __post_init__(self) -> None:
        if self.trace_id is not None:
            self.trace_id = self.trace_id.lower()
            if not _HEX32.fullmatch(self.trace_id) or self.trace_id == "0" * 32:
                raise ValueError(f"trace_id must be 32 hex digits, not all zero: {self.trace_id!r}")
        if self.span_id is not None:
            self.span_id = self.span_id.lower()
            if not _HEX16.fullmatch(self.span_id) or self.span_id == "0" * 16:
                raise ValueError(f"span_id must be 16 hex digits, not all zero: {self.span_id!r}")
        if (self.trace_id is None) != (self.span_id is None):
            raise ValueError("trace_id and span_id go together")

    @property
    def traceparent(self) -> str | None:
        """The W3C traceparent of the last run's span, or None when no span was recorded."""
        if self.trace_id is None or self.span_id is None:
            return None
        return f"00-{self.trace_id}-{self.span_id}-{self.trace_flags & 0xFF:02x}"

    @classmethod
    def from_span(cls, span: Any) -> "TapePosition":
        """Read the position from an OTel span (live or ended): its ids, run id and chain link."""
        ctx = span.get_span_context()
        attrs = dict(getattr(span, "attributes", None) or {})
        seq = attrs.get(semconv.CHAIN_SEQ)
        return cls(
            run_id=_str_or_none(attrs.get(semconv.RUN_ID)),
            trace_id=format(ctx.trace_id, "032x"),
            span_id=format(ctx.span_id, "016x"),
            trace_flags=int(ctx.trace_flags),
            chain_id=_str_or_none(attrs.get(semconv.CHAIN_ID)),
            chain_seq=int(seq) if seq is not None else None,
            chain_hash=_str_or_none(attrs.get(semconv.CHAIN_HASH)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "trace_flags": self.trace_flags,
            "chain_id": self.chain_id,
            "chain_seq": self.chain_seq,
            "chain_hash": self.chain_hash,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "TapePosition":
        data = data or {}
        return cls(
            run_id=data.get("run_id"),
            trace_id=data.get("trace_id"),
            span_id=data.get("span_id"),
            trace_flags=int(data.get("trace_flags", 1)),
            chain_id=data.get("chain_id"),
            chain_seq=data.get("chain_seq"),
            chain_hash=data.get("chain_hash"),
        )


@dataclass(frozen=True)
class TapeContext:
    """What the capture API needs to continue a restored session's tape in a new run."""

    session_id: str
    agent: str | None
    previous_run_id: str | None
    traceparent: str | None

    def span_context(self) -> Any:
        """The last run's span as a remote OTel SpanContext, or None."""
        if self.traceparent is None:
            return None
        from opentelemetry import trace

        _, trace_hex, span_hex, flags = self.traceparent.split("-")
        return trace.SpanContext(
            trace_id=int(trace_hex, 16),
            span_id=int(span_hex, 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(int(flags, 16)),
        )

    def link(self) -> Any:
        """An OTel Link from a new run's span to the last run's span, or None."""
        ctx = self.span_context()
        if ctx is None:
            return None
        from opentelemetry import trace

        attrs = {semconv.RUN_ID: self.previous_run_id} if self.previous_run_id else {}
        return trace.Link(ctx, attrs)

    def otel_context(self) -> Any:
        """An OTel Context whose parent is the last run's span (to continue in the same trace)."""
        ctx = self.span_context()
        if ctx is None:
            return None
        from opentelemetry import trace

        return trace.set_span_in_context(trace.NonRecordingSpan(ctx))

    def run_attributes(self) -> dict[str, str]:
        """Span attributes that mark a new run as part of this session and a follow-up of the last run."""
        attrs = {semconv.SESSION_ID: self.session_id}
        if self.previous_run_id:
            attrs[semconv.PREVIOUS_RUN_ID] = self.previous_run_id
        if self.agent:
            attrs[semconv.GEN_AI_AGENT_NAME] = self.agent
        return attrs

    def carrier(self) -> dict[str, str]:
        """W3C ``traceparent`` of the last run plus ``baggage`` with its run id and the session id.

        This is the carrier the capture API takes as ``follows``, so a restored session
        continues with ``tape.run(agent=..., session_id=ctx.session_id, follows=ctx.carrier())``
        (see ``run_kwargs``). Empty when the session has no recorded run yet.
        """
        span_ctx = self.span_context()
        if span_ctx is None:
            return {}
        from opentelemetry import baggage, trace
        from opentelemetry.baggage.propagation import W3CBaggagePropagator
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        ctx = trace.set_span_in_context(trace.NonRecordingSpan(span_ctx))
        if self.previous_run_id:
            ctx = baggage.set_baggage(semconv.RUN_ID, self.previous_run_id, ctx)
        ctx = baggage.set_baggage(semconv.SESSION_ID, self.session_id, ctx)
        out: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(out, context=ctx)
        W3CBaggagePropagator().inject(out, context=ctx)
        return out

    def run_kwargs(self) -> dict[str, Any]:
        """Keywords for the capture API's ``tape.run(**ctx.run_kwargs())``: same agent and session,
        and the last run as the one this run follows (a new trace whose run span links to the last
        run's span and carries ``agenttape.previous_run.id``). A later turn is not a child run, so
        a tape tree does not show a session's turns as nested agents."""
        kwargs: dict[str, Any] = {"agent": self.agent, "session_id": self.session_id}
        carrier = self.carrier()
        if carrier:
            kwargs["follows"] = carrier
        return kwargs


@dataclass
class SessionSnapshot:
    """One agent session as stored: memory, event log, compactions and tape position.

    ``version`` is the store's optimistic-concurrency counter: 0 means never saved; every
    successful save increments it, and a save whose version is not the stored one is refused.
    """

    session_id: str
    agent: str | None = None
    memory: Any = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    compactions: list[dict[str, Any]] = field(default_factory=list)
    tape: TapePosition = field(default_factory=TapePosition)
    metadata: dict[str, Any] = field(default_factory=dict)
    updated_at: datetime | None = None
    version: int = 0

    def __post_init__(self) -> None:
        validate_session_id(self.session_id)
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise ValueError(f"version must be a non-negative int, got {self.version!r}")

    # --- changing the session -------------------------------------------------------------
    def append_event(self, event: dict[str, Any]) -> None:
        """Append one JSON event to the session's log."""
        if not isinstance(event, dict):
            raise TypeError("an event is a JSON object (dict)")
        self.events.append(event)

    def compact(self, summary: Any, *, upto: int | None = None, **extra: Any) -> dict[str, Any]:
        """Replace the first ``upto`` events (default: all) by a compaction result and return it."""
        n = len(self.events) if upto is None else max(0, min(upto, len(self.events)))
        result = {
            "summary": summary,
            "events_compacted": n,
            "first_event": self.compacted_event_count(),
            "at": _now().isoformat(),
            **extra,
        }
        del self.events[:n]
        self.compactions.append(result)
        return result

    def compacted_event_count(self) -> int:
        """How many events earlier compactions replaced."""
        return sum(int(c.get("events_compacted", 0)) for c in self.compactions)

    def record_run(
        self,
        run_id: str,
        *,
        trace_id: str | None = None,
        span_id: str | None = None,
        trace_flags: int = 1,
        chain_id: str | None = None,
        chain_seq: int | None = None,
        chain_hash: str | None = None,
    ) -> None:
        """Remember the run that just ended as the tape position to continue from."""
        self.tape = TapePosition(
            run_id=run_id,
            trace_id=trace_id,
            span_id=span_id,
            trace_flags=trace_flags,
            chain_id=chain_id,
            chain_seq=chain_seq,
            chain_hash=chain_hash,
        )

    def record_span(self, span: Any, run_id: str | None = None) -> None:
        """Remember the tape position from the last run's OTel span (``run.span`` of the capture API).

        ``run_id`` overrides the span's ``agenttape.run.id`` (for spans that carry no attributes).
        """
        position = TapePosition.from_span(span)
        if run_id is not None:
            position.run_id = run_id
        self.tape = position

    def tape_context(self) -> TapeContext:
        """What a new run needs to continue this session's tape (same session, linked to the last run)."""
        return TapeContext(
            session_id=self.session_id,
            agent=self.agent,
            previous_run_id=self.tape.run_id,
            traceparent=self.tape.traceparent,
        )

    # --- format ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The stored JSON document (format 1)."""
        return {
            "format": SNAPSHOT_FORMAT,
            "session_id": self.session_id,
            "agent": self.agent,
            "version": self.version,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "memory": self.memory,
            "events": self.events,
            "compactions": self.compactions,
            "tape": self.tape.to_dict(),
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SessionSnapshot":
        """Parse a stored document; refuses a format this code does not know."""
        fmt = data.get("format")
        if fmt != SNAPSHOT_FORMAT:
            raise ValueError(f"unknown session snapshot format {fmt!r} (expected {SNAPSHOT_FORMAT})")
        updated = data.get("updated_at")
        return cls(
            session_id=data["session_id"],
            agent=data.get("agent"),
            memory=data.get("memory", {}),
            events=list(data.get("events") or []),
            compactions=list(data.get("compactions") or []),
            tape=TapePosition.from_dict(data.get("tape")),
            metadata=dict(data.get("metadata") or {}),
            updated_at=_parse_time(updated) if updated else None,
            version=int(data.get("version", 0)),
        )

    def copy(self) -> "SessionSnapshot":
        """A deep copy, so a caller can change it without touching the original."""
        return copy.deepcopy(self)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _parse_time(value: str) -> datetime:
    t = datetime.fromisoformat(value)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
