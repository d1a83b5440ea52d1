"""Validation of decoded OTLP requests: the spans and log records the store cannot hold are removed
(wrong id length, all-zero ids, times past 2262, an unknown kind) and counted by reason, so the rest
can be stored and the client told with a partial success (``Validated.message``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_agenttape.codec.otlp_view import ZERO_SPAN_ID, ZERO_TRACE_ID
from otel_agenttape.receiver.itemcheck import MAX_TIME, log_time_problem, span_time_problem
from otel_agenttape.store.span_rules import KIND_MAX, KIND_MIN, span_problem


@dataclass
class Validated:
    """A request with its invalid items removed; ``rejected`` = how many were dropped, ``accepted`` kept."""

    request: Any
    accepted: int
    rejected: int
    message: str
    changed: bool
    problems: dict[str, int] | None = None  # the rejected items by reason


def _all_spans_valid(spans: Any) -> bool:
    """Fast pass over the common case (every span valid); the slow pass says what is wrong."""
    for sp in spans:
        t, s = sp.trace_id, sp.span_id
        if len(t) != 16 or len(s) != 8 or t == ZERO_TRACE_ID or s == ZERO_SPAN_ID:
            return False
        p = sp.parent_span_id
        if p and len(p) != 8:
            return False
        if not KIND_MIN <= sp.kind <= KIND_MAX:
            return False
        start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
        if end < start or end > MAX_TIME:
            return False
        for ev in sp.events:
            if ev.time_unix_nano > MAX_TIME:
                return False
        if sp.links:
            for link in sp.links:
                if len(link.trace_id) != 16 or len(link.span_id) != 8:
                    return False
    return True


def summary(problems: dict[str, int], noun: str = "spans") -> str:
    """The partial-success message: how many items were rejected, by reason (most frequent first)."""
    parts = [f"{n} with {why}" for why, n in sorted(problems.items(), key=lambda kv: -kv[1])]
    return f"rejected {noun}: " + "; ".join(parts)


def _drop_invalid(req: Any, groups: Any, problem: Any, noun: str, all_valid: Any = None,
                  earlier: dict[str, int] | None = None) -> Validated:
    """Drop the items whose ``problem(item)`` names one, from each repeated field in ``groups``;
    ``all_valid(items)`` is an optional fast check for the common case of a group with nothing wrong;
    ``earlier``: items already left out while decoding, by reason.
    The request is mutated in place only when something was dropped."""
    accepted = 0
    problems: dict[str, int] = dict(earlier or {})
    bad_groups: list[tuple[Any, list[int]]] = []
    for items in groups:
        if all_valid is not None and all_valid(items):
            accepted += len(items)
            continue
        bad: list[int] = []
        for i, item in enumerate(items):
            why = problem(item)
            if why is None:
                accepted += 1
            else:
                bad.append(i)
                problems[why] = problems.get(why, 0) + 1
        if bad:
            bad_groups.append((items, bad))
    rejected = sum(problems.values())
    if not rejected:
        return Validated(req, accepted, 0, "", False)
    if not bad_groups:  # only items left out while decoding
        return Validated(req, accepted, rejected, summary(problems, noun), True, problems)
    for items, bad in bad_groups:
        for i in reversed(bad):
            del items[i]
    return Validated(req, accepted, rejected, summary(problems, noun), True, problems)


def validate_traces(req: ExportTraceServiceRequest, earlier: dict[str, int] | None = None) -> Validated:
    """Drop spans with invalid ids; returns the request (mutated in place only when something was dropped).
    ``earlier``: spans ``decode_traces`` already left out, by reason, counted as rejected too."""
    groups = (ss.spans for rs in req.resource_spans for ss in rs.scope_spans)
    return _drop_invalid(req, groups, _span_problem, "spans", _all_spans_valid, earlier)


def _span_problem(sp: Any) -> str | None:
    return span_problem(sp) or span_time_problem(sp)


def _log_problem(rec: Any) -> str | None:
    tid, sid = rec.trace_id, rec.span_id
    if tid and len(tid) != 16:
        return f"trace_id must be empty or 16 bytes, got {len(tid)}"
    if sid and len(sid) != 8:
        return f"span_id must be empty or 8 bytes, got {len(sid)}"
    return log_time_problem(rec)


def validate_logs(req: ExportLogsServiceRequest, earlier: dict[str, int] | None = None) -> Validated:
    """Drop log records with invalid ids (ids are optional on logs, but must have the right length)."""
    groups = (sl.log_records for rl in req.resource_logs for sl in rl.scope_logs)
    return _drop_invalid(req, groups, _log_problem, "log records", None, earlier)
