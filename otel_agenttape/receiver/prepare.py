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

from otel_agenttape.codec import otlp_view
from otel_agenttape.codec.otlp_decode import JSON, DecodeError, decode_logs, decode_traces, too_many
from otel_agenttape.receiver.itemcheck import metric_reason, salvage_traces, times_in_range
from otel_agenttape.receiver.validation import summary, validate_logs, validate_traces
from otel_agenttape.receiver.wirecount import count_items
from otel_agenttape.receiver.wal import KIND_TRACES
from otel_agenttape.store import rows


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


def prepare(kind: int, body: bytes, media: str, convert: bool = True, max_items: int | None = None) -> Prepared:
    """Decode ``body`` (``DecodeError`` if it is not a request), drop invalid spans or log records and,
    with ``convert``, build the rows; otherwise keep the decoded message for the writer.

    ``max_items``: refuse (``TooManyItems``) a request with more spans or log records, before it is
    decoded; the memory a request takes here grows with that count."""
    if max_items is not None and media != JSON:
        n = count_items(body, max_items)
        if n > max_items:
            raise too_many(n, max_items, "spans" if kind == KIND_TRACES else "log records")
    if kind == KIND_TRACES and media != JSON and convert:
        return _prepare_protobuf_traces(body)
    problems: dict[str, int] = {}  # items left out while decoding (JSON ids, strings), answered as partial success
    if kind == KIND_TRACES:
        req = decode_traces(body, media, problems, max_items)
        v = validate_traces(req, problems)
    else:
        req = decode_logs(body, media, problems, max_items)
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
    """Rejections by the ``reason`` label of ``agenttape_*_rejected_total``: ``invalid_kind`` (a span
    kind the store cannot hold), ``invalid_time``, ``invalid_utf8``, else ``invalid_id``."""
    out: dict[str, int] = {}
    for why, n in problems.items():
        reason = metric_reason(why)
        out[reason] = out.get(reason, 0) + n
    return out


TRIM_BYTES = 4 * 1024 * 1024  # after a request this large, a converter gives its memory back


def release_memory() -> None:
    """Return freed memory to the system: Arrow's pool keeps it, and so does glibc's heap for the
    many small blocks a large request's rows were built from."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception:  # noqa: BLE001 - an older pyarrow or another pool: nothing to release
        pass
    if _libc is not None:
        _libc.malloc_trim(0)


def _load_libc() -> Any:
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc()


# times are stored as BIGINT nanoseconds: a fixed64 time past 2^63 - 1 (the year 2262) has no row
_OUT_OF_RANGE = "a time past 2^63 - 1 ns (the year 2262) cannot be stored"


def _prepare_protobuf_traces(body: bytes) -> Prepared:
    problems: dict[str, int] = {}
    try:
        tables = rows.traces_to_tables([body], problems)
        if times_in_range(tables):
            return _prepared_traces(body, tables, problems)
    except (_ProtoDecodeError, ValueError, RuntimeError, OverflowError):
        pass
    # rare: a span with a string that is not UTF-8 or a time the store cannot hold: without those spans
    problems = {}
    try:
        clean = salvage_traces(body, problems)
    except (_ProtoDecodeError, ValueError, RuntimeError) as exc:
        raise DecodeError(f"invalid OTLP protobuf: {exc}") from None
    try:
        tables = rows.traces_to_tables([clean], problems)
    except (_ProtoDecodeError, ValueError, RuntimeError) as exc:
        raise DecodeError(f"invalid OTLP protobuf: {exc}") from None
    except OverflowError as exc:
        raise DecodeError(f"invalid OTLP protobuf: {_OUT_OF_RANGE} ({exc})") from None
    rejected = sum(problems.values())
    if not rejected:
        return Prepared(tables.spans.num_rows + tables.in_batch_duplicates, 0, "", None, tables)
    accepted = tables.spans.num_rows + tables.in_batch_duplicates
    message = summary(problems)
    if not accepted:
        return Prepared(0, rejected, message, None, reasons=metric_reasons(problems))
    return Prepared(accepted, rejected, message, clean, tables, reasons=metric_reasons(problems))


def _prepared_traces(body: bytes, tables: Any, problems: dict[str, int]) -> Prepared:
    rejected = sum(problems.values())
    accepted = tables.spans.num_rows + tables.in_batch_duplicates
    if not rejected:
        return Prepared(accepted, 0, "", None, tables)
    # rare: store (and log in the WAL) only the valid spans, like a client that sent just those
    wire = otlp_view.parse_traces(body)
    for rs in wire.resource_spans:
        for ss in rs.scope_spans:
            spans = ss.spans
            for i in reversed([i for i, sp in enumerate(spans) if rows.span_problem(sp) is not None]):
                del spans[i]
    message = summary(problems)
    if not accepted:
        return Prepared(0, rejected, message, None, reasons=metric_reasons(problems))
    return Prepared(accepted, rejected, message, wire.SerializeToString(), tables, reasons=metric_reasons(problems))
