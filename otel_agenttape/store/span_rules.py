"""Which spans the store can hold: the id and kind rules the receiver answers partial success with."""

from __future__ import annotations

from typing import Any

from otel_agenttape.codec.otlp_view import ZERO_SPAN_ID, ZERO_TRACE_ID

# the store's kind column is a TINYINT: a kind OTLP may add later still fits, an absurd one is rejected
KIND_MIN, KIND_MAX = -128, 127


def span_problem(span: Any) -> str | None:
    """Why a span cannot be stored (bad ids), or None: the rule the receiver answers partial success with."""
    tid = span.trace_id
    if len(tid) != 16:
        return f"trace_id must be 16 bytes, got {len(tid)}"
    if tid == ZERO_TRACE_ID:
        return "trace_id is all zeros"
    sid = span.span_id
    if len(sid) != 8:
        return f"span_id must be 8 bytes, got {len(sid)}"
    if sid == ZERO_SPAN_ID:
        return "span_id is all zeros"
    pid = span.parent_span_id
    if pid and len(pid) != 8:
        return f"parent_span_id must be empty or 8 bytes, got {len(pid)}"
    for link in span.links:
        if len(link.trace_id) != 16 or len(link.span_id) != 8:
            return "link ids must be 16 (trace) and 8 (span) bytes"
    if not KIND_MIN <= span.kind <= KIND_MAX:
        return f"kind must be between {KIND_MIN} and {KIND_MAX} (OTLP's are 0-5), got {span.kind}"
    return None
