"""Sealed span rows read back from the store, and their chain entries by the reference path.

``load_rows`` / ``iter_rows`` give the stored ``spans`` rows with their ``span_events`` and
``span_links`` rows attached; ``row_entry`` recomputes a row's canonical leaf (``integrity.leaf``)
and reads its chain fields from the typed ``attributes`` (the truth), comparing them with the promoted
``chain_*`` columns. ``sealed_entries.py`` is the fast path to the same entries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from otel_agenttape import semconv
from otel_agenttape.integrity.leaf import CommitmentError, leaf_bytes, parse_erased, project_row
from otel_agenttape.integrity.verify import Entry

SPAN_COLS = (
    "trace_id, span_id, parent_span_id, trace_state, name, kind, start_time_unix_nano, end_time_unix_nano, "
    "status_code, status_message, attributes, dropped_attributes_count, dropped_events_count, "
    "dropped_links_count, chain_id, chain_seq, chain_prev, chain_hash, chain_epoch"
)
EVENT_COLS = "e.trace_id, e.span_id, e.event_index, e.time_unix_nano, e.name, e.attributes, e.dropped_attributes_count"
LINK_COLS = (
    "l.trace_id, l.span_id, l.link_index, l.linked_trace_id, l.linked_span_id, l.trace_state, l.attributes, "
    "l.dropped_attributes_count"
)


def _rows(table: Any) -> list[dict[str, Any]]:
    cols = table.column_names
    data = [table.column(c).to_pylist() for c in cols]
    return [dict(zip(cols, vals)) for vals in zip(*data)]


def query_rows(reader: Any, where: str, params: Sequence[Any]) -> tuple[Any, dict, dict]:
    """The ``spans`` table selected by ``where``, and its events and links by ``(trace_id, span_id)``."""
    p = list(params) or None
    spans = reader.query(f"SELECT {SPAN_COLS} FROM spans WHERE {where}", p)
    if spans.num_rows == 0:
        return spans, {}, {}
    return (spans, *_events_and_links(reader, where, p))


def _events_and_links(reader: Any, where: str, p: list[Any] | None) -> tuple[dict, dict]:
    """The events (in their order) and links of the spans ``where`` selects, by ``(trace_id, span_id)``."""
    sub = f"SELECT trace_id, span_id FROM spans WHERE {where}"
    ev_by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in _rows(reader.query(f"SELECT {EVENT_COLS} FROM span_events e SEMI JOIN ({sub}) s "
                                f"ON e.trace_id = s.trace_id AND e.span_id = s.span_id "
                                f"ORDER BY e.trace_id, e.span_id, e.event_index", p)):
        ev_by[(e["trace_id"], e["span_id"])].append(e)
    lk_by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for lk in _rows(reader.query(f"SELECT {LINK_COLS} FROM span_links l SEMI JOIN ({sub}) s "
                                 f"ON l.trace_id = s.trace_id AND l.span_id = s.span_id", p)):
        lk_by[(lk["trace_id"], lk["span_id"])].append(lk)
    return dict(ev_by), dict(lk_by)


def query_row_batches(reader: Any, where: str, params: Sequence[Any], rows: int = 65536
                      ) -> tuple[Iterator[Any], dict, dict]:
    """``query_rows`` with the spans streamed in record batches of at most ``rows``.

    The spans' query is started first and its first batch taken, then the events and links are read
    whole (they are few beside the spans): a span committed with its events while this reads is then
    either in neither read or in both, never found without its events (a stream reads the store as it
    was when it started)."""
    p = list(params) or None
    stream = getattr(reader, "query_batches", None)
    if stream is None:  # a reader with only ``query``
        spans = iter(reader.query(f"SELECT {SPAN_COLS} FROM spans WHERE {where}", p).to_batches(max_chunksize=rows))
    else:
        spans = stream(f"SELECT {SPAN_COLS} FROM spans WHERE {where}", p, rows)
    first = next(spans, None)
    ev_by, lk_by = _events_and_links(reader, where, p)

    def batches() -> Iterator[Any]:
        if first is not None:
            yield first
            yield from spans

    return batches(), ev_by, lk_by


def iter_rows(reader: Any, where: str = "chain_id IS NOT NULL", params: Sequence[Any] = (),
              batch_rows: int = 65536) -> Iterator[dict[str, Any]]:
    """Span rows (with ``events`` and ``links`` lists attached) selected by a ``spans`` filter."""
    spans, ev_by, lk_by = query_rows(reader, where, params)
    for rb in spans.to_batches(max_chunksize=batch_rows):
        yield from _batch_rows(rb, ev_by, lk_by)


def _batch_rows(rb: Any, ev_by: dict, lk_by: dict) -> Iterator[dict[str, Any]]:
    no_events: list[dict[str, Any]] = []
    cols = rb.schema.names
    data = [rb.column(i).to_pylist() for i in range(len(cols))]
    for vals in zip(*data):
        r = dict(zip(cols, vals))
        key = (r["trace_id"], r["span_id"])
        r["events"] = ev_by.get(key, no_events) if ev_by else no_events
        r["links"] = lk_by.get(key, no_events) if lk_by else no_events
        yield r


# A compact entry as a plain tuple (cheap to send back from a worker process):
# (chain_id, epoch, seq, prev, hash, computed_hash, merkle_leaf, span_id, trace_id, problem, erased)
CompactEntry = tuple


def from_compact(t: CompactEntry) -> tuple[str, int, Entry]:
    return t[0], t[1], Entry(t[2], t[3], t[4], None, t[7], t[8], t[9], t[5], t[6], t[10])


def to_compact(chain_id: str, epoch: int, e: Entry) -> CompactEntry:
    e.compact()
    return (chain_id, epoch, e.seq, e.prev, e.hash, e.computed_hash, e.merkle_leaf, e.span_id, e.trace_id, e.problem,
            e.erased)


def load_rows(reader: Any, where: str = "chain_id IS NOT NULL", params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    return list(iter_rows(reader, where, params))


def row_leaf(row: dict[str, Any]) -> bytes:
    """The canonical leaf of a row from ``load_rows``."""
    return leaf_bytes(project_row(row, row.get("events", ()), row.get("links", ())))


def typed_scalar(t: Any) -> Any:
    """The value of a stored typed string or int (``{"s": ...}``, ``{"i": ...}``), else None."""
    if not isinstance(t, dict):
        return None
    if "s" in t:
        return t["s"]
    if "i" in t:
        try:
            return int(t["i"])
        except (TypeError, ValueError):
            return None
    return None


def row_entry(row: dict[str, Any]) -> tuple[str, int, Entry]:
    """``(chain_id, epoch, entry)`` of a sealed span row; chain fields are taken from ``attributes``."""
    attrs = row["attributes"]
    if isinstance(attrs, (str, bytes)):
        try:
            attrs = orjson.loads(attrs) if attrs else {}
        except orjson.JSONDecodeError:
            attrs = None
        row["attributes"] = attrs
    if not isinstance(attrs, dict):  # attributes that are not a JSON object: nothing to check them against
        entry = Entry(int(row.get("chain_seq") or 0), row.get("chain_prev"), row.get("chain_hash"), None,
                      row["span_id"], row["trace_id"], "content unreadable (attributes are not a JSON object)")
        return str(row.get("chain_id")), int(row.get("chain_epoch") or 0), entry
    problem = None
    chain_id = typed_scalar(attrs.get(semconv.CHAIN_ID))
    seq = typed_scalar(attrs.get(semconv.CHAIN_SEQ))
    prev = typed_scalar(attrs.get(semconv.CHAIN_PREV))
    hsh = typed_scalar(attrs.get(semconv.CHAIN_HASH))
    epoch = typed_scalar(attrs.get(semconv.CHAIN_EPOCH)) or 0
    if chain_id is None or not isinstance(seq, int):
        problem = "chain attributes missing or malformed"
        chain_id = chain_id if isinstance(chain_id, str) else row.get("chain_id")
        seq = seq if isinstance(seq, int) else int(row.get("chain_seq") or 0)
    elif (row.get("chain_id"), row.get("chain_seq"), row.get("chain_prev"), row.get("chain_hash"),
          row.get("chain_epoch") or 0) != (chain_id, seq, prev, hsh, epoch):
        problem = "chain columns differ from the span's chain attributes"
    try:
        leaf: bytes | None = row_leaf(row)
    except CommitmentError as exc:  # salts or erased commitments that do not fit the stored values
        leaf, problem = None, f"commitments do not fit the span ({exc})"
    except Exception as exc:  # a row the projection cannot read is itself evidence of tampering
        leaf, problem = None, f"content unreadable ({type(exc).__name__})"
    entry = Entry(seq, prev if isinstance(prev, str) else None, hsh if isinstance(hsh, str) else None, leaf,
                  row["span_id"], row["trace_id"], problem, erased=_erased_map(attrs))
    return str(chain_id), int(epoch), entry


def _erased_map(attrs: dict[str, Any]) -> dict[str, str] | None:
    """The span's erased values (leaf v2), when its map is readable (else the leaf says what is wrong)."""
    t = attrs.get(semconv.CHAIN_ERASED)
    if t is None:
        return None
    try:
        return parse_erased(typed_scalar(t))
    except CommitmentError:
        return None
