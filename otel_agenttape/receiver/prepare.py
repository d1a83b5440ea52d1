"""One pass from a request body to what the pipeline needs: decode, drop invalid items, convert to rows.

The transport must know before it answers whether the body decodes (400 otherwise) and how many
items were rejected (partial success), and the writer needs Arrow rows. Doing all three in one pass
over the body (in a converter process when the pool runs, see ``convert.py``) means the receiver's
main process never decodes a request: it reads the body, appends it to the WAL and inserts rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError as _ProtoDecodeError

from otel_agenttape.receiver.decode import (
    JSON,
    DecodeError,
    decode_logs,
    decode_traces,
    summary,
    validate_logs,
    validate_traces,
)
from otel_agenttape.receiver.wal import KIND_TRACES
from otel_agenttape.store import otlpwire, rows


@dataclass
class Prepared:
    """A decoded, validated request. ``payload`` is the WAL record when it is not the body itself (JSON
    bodies, or invalid items dropped); ``tables`` are its rows (None when the writer converts)."""

    accepted: int
    rejected: int
    message: str
    payload: bytes | None
    tables: Any = None
    request: Any = None  # the decoded message, for stores without ``write_tables``
    reasons: dict[str, int] | None = None  # rejected items by metric reason (None: all "invalid_id")

    def wal_record(self, body: bytes) -> bytes:
        """The bytes to append to the WAL for a request that arrived as ``body``."""
        return body if self.payload is None else self.payload


def prepare(kind: int, body: bytes, media: str, convert: bool = True) -> Prepared:
    """Decode ``body`` (``DecodeError`` if it is not a request), drop invalid spans or log records and,
    with ``convert``, build the rows; otherwise keep the decoded message for the writer."""
    if kind == KIND_TRACES and media != JSON and convert:
        return _prepare_protobuf_traces(body)
    problems: dict[str, int] = {}  # JSON items whose ids are not hex: left out, answered as partial success
    if kind == KIND_TRACES:
        req = decode_traces(body, media, problems)
        v = validate_traces(req, problems)
    else:
        req = decode_logs(body, media, problems)
        v = validate_logs(req, problems)
    payload = None if media != JSON and not v.changed else req.SerializeToString()
    if not v.accepted:
        return Prepared(0, v.rejected, v.message, payload, reasons=metric_reasons(v.problems or {}))
    tables = None
    if convert:
        try:
            tables = rows.traces_to_tables([req]) if kind == KIND_TRACES else rows.logs_to_tables([req])
        except (_ProtoDecodeError, ValueError) as exc:
            raise DecodeError(f"invalid OTLP request: {exc}") from None
        except OverflowError as exc:
            raise DecodeError(f"invalid OTLP request: {_OUT_OF_RANGE} ({exc})") from None
    return Prepared(v.accepted, v.rejected, v.message, payload, tables, None if convert else req,
                    metric_reasons(v.problems or {}))


def metric_reasons(problems: dict[str, int]) -> dict[str, int]:
    """Rejections by the ``reason`` label of ``agenttape_*_rejected_total``: a span kind the store
    cannot hold is ``invalid_kind``, every other problem is an id (``invalid_id``)."""
    out: dict[str, int] = {}
    for why, n in problems.items():
        reason = "invalid_kind" if why.startswith("kind ") else "invalid_id"
        out[reason] = out.get(reason, 0) + n
    return out


# times are stored as BIGINT nanoseconds: a fixed64 time past 2^63 - 1 (the year 2262) has no row
_OUT_OF_RANGE = "a time past 2^63 - 1 ns (the year 2262) cannot be stored"


def _prepare_protobuf_traces(body: bytes) -> Prepared:
    problems: dict[str, int] = {}
    try:
        tables = rows.traces_to_tables([body], problems)
    except (_ProtoDecodeError, ValueError, RuntimeError) as exc:
        raise DecodeError(f"invalid OTLP protobuf: {exc}") from None
    except OverflowError as exc:
        raise DecodeError(f"invalid OTLP protobuf: {_OUT_OF_RANGE} ({exc})") from None
    rejected = sum(problems.values())
    accepted = tables.spans.num_rows + tables.in_batch_duplicates
    if not rejected:
        return Prepared(accepted, 0, "", None, tables)
    # rare: store (and log in the WAL) only the valid spans, like a client that sent just those
    wire = otlpwire.parse_traces(body)
    for rs in wire.resource_spans:
        for ss in rs.scope_spans:
            spans = ss.spans
            for i in reversed([i for i, sp in enumerate(spans) if rows.span_problem(sp) is not None]):
                del spans[i]
    message = summary(problems)
    if not accepted:
        return Prepared(0, rejected, message, None, reasons=metric_reasons(problems))
    return Prepared(accepted, rejected, message, wire.SerializeToString(), tables, reasons=metric_reasons(problems))
