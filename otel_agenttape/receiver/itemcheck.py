"""The per-item rules beyond ids: times the store can hold and strings that are UTF-8.

The OTLP protobuf parser fails a whole request for one string that is not UTF-8, and an int64
column cannot hold a time past 2^63 - 1 ns (the year 2262); either would fail every span sent
with the bad one. These checks name the one item so the rest is stored and the client told with
a partial success. ``salvage_traces`` is the slow path ``prepare.py`` takes only when the fast
conversion of a request failed or found a bad time.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError as _ProtoDecodeError
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_agenttape.codec import otlp_view
from otel_agenttape.codec.otlp_decode import BAD_UTF8
from otel_agenttape.store.span_rules import span_problem

MAX_TIME = 2**63 - 1
PAST_2262 = "past 2^63 - 1 ns (the year 2262)"
END_BEFORE_START = "end_time_unix_nano before start_time_unix_nano"

# the ``reason`` label of agenttape_*_rejected_total for each kind of problem text
_REASONS = (("kind ", "invalid_kind"), (BAD_UTF8, "invalid_utf8"))


def metric_reason(why: str) -> str:
    """``invalid_kind``, ``invalid_time``, ``invalid_utf8`` or ``invalid_id`` for a problem text."""
    for prefix, reason in _REASONS:
        if why.startswith(prefix):
            return reason
    if "time" in why:
        return "invalid_time"
    return "invalid_id"


def span_time_problem(sp: Any) -> str | None:
    """Why a span's times cannot be stored (past 2262, end before start), or None."""
    start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
    if start > MAX_TIME:
        return f"start_time_unix_nano {PAST_2262}"
    if end > MAX_TIME:
        return f"end_time_unix_nano {PAST_2262}"
    if end < start:
        return END_BEFORE_START
    for ev in sp.events:
        if ev.time_unix_nano > MAX_TIME:
            return f"event time_unix_nano {PAST_2262}"
    return None


def log_time_problem(rec: Any) -> str | None:
    if rec.time_unix_nano > MAX_TIME:
        return f"time_unix_nano {PAST_2262}"
    if rec.observed_time_unix_nano > MAX_TIME:
        return f"observed_time_unix_nano {PAST_2262}"
    return None


def _span_bytes_problem(raw: bytes) -> str | None:
    try:
        sp = Span.FromString(raw)  # the OTLP class checks every string, attributes and events included
    except (_ProtoDecodeError, ValueError, RuntimeError):
        return BAD_UTF8
    return span_problem(sp) or span_time_problem(sp)


def salvage_traces(body: bytes, problems: dict[str, int]) -> bytes:
    """The request without the spans that cannot be stored (counted in ``problems`` by reason);
    raises ``google.protobuf.message.DecodeError`` when the request itself does not parse."""
    req = otlp_view.RawTracesRequest.FromString(body)
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            keep = []
            for raw in ss.spans:
                why = _span_bytes_problem(raw)
                if why is None:
                    keep.append(raw)
                else:
                    problems[why] = problems.get(why, 0) + 1
            if len(keep) != len(ss.spans):
                del ss.spans[:]
                ss.spans.extend(keep)
    return req.SerializeToString()


def times_in_range(tables: Any) -> bool:
    """False when a converted span ends before it starts (times past 2262 never convert)."""
    spans = tables.spans
    if not spans.num_rows:
        return True
    import pyarrow.compute as pc

    return not pc.any(pc.less(spans.column("end_time_unix_nano"), spans.column("start_time_unix_nano"))).as_py()
