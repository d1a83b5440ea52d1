"""OTLP requests -> Arrow tables shaped exactly like the store tables (``schema.py``).

This is the ingest hot path. Trace requests are read through ``otlpwire`` (attributes stay raw
``KeyValue`` bytes, mapped to typed JSON members through a cache, see below), each span becomes one
tuple (columns are transposed in C with ``zip``), and the attribute encoding matches
``anyvalue.attrs_from_proto`` + ``anyvalue.dumps`` byte for byte (tests check it). Log requests are
read as OTLP messages. Spans repeated within one conversion (same trace id + span id) are kept once:
the first wins.
"""

from __future__ import annotations

import gc
import hashlib
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import orjson
import pyarrow as pa
from google.protobuf.message import DecodeError as _ProtoDecodeError
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_agenttape import anyvalue, native
from otel_agenttape import semconv as sc
from otel_agenttape.store import otlpwire, schema

_NS_PER_DAY = 86_400 * 1_000_000_000
_SORT = orjson.OPT_SORT_KEYS

_DUCK_TO_ARROW = {
    "VARCHAR": pa.string(),
    # arrow.json: DuckDB takes it as JSON without re-validating text orjson produced
    "JSON": pa.json_(pa.string()),
    "UINTEGER": pa.uint32(),
    "TINYINT": pa.int8(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "DATE": pa.date32(),
}


def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of a store table, derived from the DuckDB column contract."""
    fields = []
    for name, ddl in schema.TABLES[table]:
        base = ddl.split()[0]
        fields.append(pa.field(name, _DUCK_TO_ARROW[base], nullable="NOT NULL" not in ddl))
    return pa.schema(fields)


SCHEMAS: dict[str, pa.Schema] = {name: arrow_schema(name) for name in schema.TABLES}

_PLAIN, _FLOAT, _DATE, _JSON = range(4)
_KINDS = {t: _FLOAT if t == pa.float64() else _DATE if t == pa.date32() else
          _JSON if isinstance(t, pa.ExtensionType) else _PLAIN for t in _DUCK_TO_ARROW.values()}


def _typed(value: Any) -> dict[str, Any]:
    """One AnyValue -> typed form: the shared encoding, so stored rows hash like live spans."""
    return anyvalue.from_proto(value)


def _typed_attrs(key_values: Iterable[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in key_values:
        v = kv.value
        s = v.string_value  # most values are strings: skip WhichOneof for them
        out[kv.key] = {"s": s} if s else _typed(v)
    return out


def _text(t: dict[str, Any] | None) -> str | None:
    if not t:
        return None
    s = t.get("s")
    if s is not None:
        return s
    if "i" in t:
        return t["i"]
    if "d" in t:
        return t["d"]
    if "bool" in t:
        return "true" if t["bool"] else "false"
    return orjson.dumps(t, option=_SORT).decode()


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _int(t: dict[str, Any] | None) -> int | None:
    """The value of an int column (BIGINT): None when the attribute holds no int64."""
    if not t:
        return None
    i = t.get("i")
    if i is not None:
        return int(i)
    if "d" in t:
        try:
            v = float(t["d"])
        except ValueError:
            return None
        if not (math.isfinite(v) and v == int(v)):
            return None
        n = int(v)
    else:
        s = t.get("s")
        if s is None or not s.lstrip("-").isdigit():
            return None
        try:
            n = int(s)
        except ValueError:
            return None
    return n if _I64_MIN <= n <= _I64_MAX else None


def resource_id(schema_url: str, attributes_json: str) -> str:
    """sha256 hex of (schema_url, typed attributes JSON): equal resources share one row."""
    return hashlib.sha256(f"{schema_url}\n{attributes_json}".encode()).hexdigest()


@dataclass
class Tables:
    """Rows of one conversion, one Arrow table per store table."""

    spans: pa.Table
    span_events: pa.Table
    span_links: pa.Table
    resources: pa.Table
    log_records: pa.Table
    in_batch_duplicates: int = 0  # repeats dropped, conflicts included
    in_batch_conflicts: int = 0  # repeats whose content differs from the first copy (conflicts.py)
    conflict_example: str | None = None

    def as_dict(self) -> dict[str, pa.Table]:
        return {
            "spans": self.spans,
            "span_events": self.span_events,
            "span_links": self.span_links,
            "log_records": self.log_records,
            "resources": self.resources,
        }


def _first_seen(keys: list[Any], seen: set[Any]) -> list[bool]:
    keep = []
    for k in keys:
        keep.append(k not in seen)
        seen.add(k)
    return keep


def concat(parts: list[Tables]) -> Tables:
    """One ``Tables`` from several conversions (written in one transaction); a span, log record or
    resource repeated across parts is kept once (the first), like repeats within one conversion."""
    if len(parts) == 1:
        return parts[0]
    import pyarrow.compute as pc

    dups = sum(p.in_batch_duplicates for p in parts)
    span_keys = [pc.binary_join_element_wise(p.spans.column("trace_id"), p.spans.column("span_id"), "")
                 for p in parts]
    n_spans = sum(len(k) for k in span_keys)
    # the chunks of the keys' chunked arrays: given the chunked arrays themselves, pa.chunked_array
    # would convert them value by value through Python scalars
    chunks = [c for k in span_keys for c in k.chunks]
    if n_spans and pc.count_distinct(pa.chunked_array(chunks, type=pa.string())).as_py() < n_spans:
        seen: set[Any] = set()
        fixed = []
        repeats = []
        for p, keys in zip(parts, span_keys):
            keep = pa.array(_first_seen(keys.to_pylist(), seen), type=pa.bool_())
            if pc.all(keep).as_py():
                fixed.append(p)
                continue
            dropped = pc.filter(keys, pc.invert(keep))
            dups += len(dropped)
            repeats.append(p.spans.filter(pc.invert(keep)))

            def others(t: pa.Table, dropped: pa.Array = dropped) -> pa.Table:
                if not t.num_rows:
                    return t
                k = pc.binary_join_element_wise(t.column("trace_id"), t.column("span_id"), "")
                return t.filter(pc.invert(pc.is_in(k, dropped)))

            fixed.append(Tables(p.spans.filter(keep), others(p.span_events), others(p.span_links),
                                p.resources, p.log_records))
        parts = fixed
        from otel_agenttape.store.conflicts import count_differing

        conflicts, example = count_differing(pa.concat_tables([p.spans for p in parts]), pa.concat_tables(repeats))
        conflicts += sum(p.in_batch_conflicts for p in parts)
    else:
        conflicts, example = sum(p.in_batch_conflicts for p in parts), None
    logs = pa.concat_tables([p.log_records for p in parts])
    if logs.num_rows and pc.count_distinct(logs.column("log_id")).as_py() < logs.num_rows:
        keep = pa.array(_first_seen(logs.column("log_id").to_pylist(), set()), type=pa.bool_())
        dups += logs.num_rows - pc.sum(keep.cast(pa.int64())).as_py()
        logs = logs.filter(keep)
    res = pa.concat_tables([p.resources for p in parts])
    if res.num_rows > 1:
        res = res.filter(pa.array(_first_seen(res.column("resource_id").to_pylist(), set()), type=pa.bool_()))
    return Tables(
        spans=pa.concat_tables([p.spans for p in parts]),
        span_events=pa.concat_tables([p.span_events for p in parts]),
        span_links=pa.concat_tables([p.span_links for p in parts]),
        resources=res,
        log_records=logs,
        in_batch_duplicates=dups,
        in_batch_conflicts=conflicts,
        conflict_example=example,
    )


def _table(name: str, rows: list[tuple], columns: Any = None) -> pa.Table:
    """The store table ``name`` of ``rows``; ``columns``: the compiled transposition (``_spanwalk.columns``),
    which steps through the rows in C where ``zip(*rows)`` steps one iterator per row."""
    sch = SCHEMAS[name]
    if not rows:
        return _empty(name)
    n = len(rows)
    arrays = []
    cols = columns(rows, len(sch)) if columns is not None else None
    for f, col in zip(sch, cols if cols is not None else zip(*rows)):
        kind = _KINDS[f.type]
        storage = f.type.storage_type if kind == _JSON else pa.int32() if kind == _DATE else f.type
        first = col[0]
        # one value in every row (resource, scope, service, day, most promoted columns of a batch):
        # repeat it in C rather than convert each row. Not for floats, where 0.0 == -0.0.
        if first is not None and kind != _FLOAT and col.count(first) == n:
            arr = pa.repeat(pa.scalar(first, type=storage), n)
        else:
            arr = pa.array(col, type=storage)
        if kind == _DATE:
            arr = arr.view(pa.date32())
        elif kind == _JSON:
            arr = pa.ExtensionArray.from_storage(f.type, arr)
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=sch)


# built once: making an empty table of a wide schema costs tens of microseconds, per request
_EMPTY: dict[str, pa.Table] = {}


def _empty(name: str) -> pa.Table:
    t = _EMPTY.get(name)
    if t is None:
        t = _EMPTY[name] = SCHEMAS[name].empty_table()
    return t


class _Resources:
    def __init__(self) -> None:
        self.rows: dict[str, tuple] = {}

    def add(self, resource: Any, schema_url: str) -> tuple[str, str | None]:
        typed = _typed_attrs(resource.attributes)
        attrs_json = orjson.dumps(typed, option=_SORT).decode()
        rid = resource_id(schema_url, attrs_json)
        if rid not in self.rows:
            self.rows[rid] = (rid, attrs_json, schema_url or None, resource.dropped_attributes_count)
        svc = typed.get("service.name")
        return rid, (_text(svc) if svc else None)

    def add_wire(self, resource: Any, schema_url: str) -> tuple[str, str | None]:
        """``add`` for an ``otlpwire`` resource (attributes as raw ``KeyValue`` bytes); cached by content."""
        ckey = (tuple(resource.attributes), tuple(resource.entity_refs), resource.dropped_attributes_count, schema_url)
        hit = _RESOURCE_CACHE.get(ckey)
        if hit is None:
            real = Resource.FromString(resource.SerializeToString())  # the OTLP message, checked as such
            if len(_RESOURCE_CACHE) >= _CACHE_ENTRIES:
                _RESOURCE_CACHE.clear()
            hit = _RESOURCE_CACHE[ckey] = self._row(real, schema_url)
        row, service = hit
        if row[0] not in self.rows:
            self.rows[row[0]] = row
        return row[0], service

    @staticmethod
    def _row(resource: Any, schema_url: str) -> tuple[tuple, str | None]:
        typed = _typed_attrs(resource.attributes)
        attrs_json = orjson.dumps(typed, option=_SORT).decode()
        rid = resource_id(schema_url, attrs_json)
        svc = typed.get("service.name")
        return (rid, attrs_json, schema_url or None, resource.dropped_attributes_count), (_text(svc) if svc else None)

    def table(self) -> pa.Table:
        return _table("resources", list(self.rows.values()))


# promoted columns in spans column order (after service_name): (attribute, as int?)
_PROMOTED: list[tuple[str, bool]] = [
    (sc.GEN_AI_OPERATION_NAME, False),
    (sc.GEN_AI_AGENT_NAME, False),
    (sc.RUN_ID, False),
    (sc.SESSION_ID, False),
    (sc.PARENT_RUN_ID, False),
    (sc.RUN_STATUS, False),
    (sc.TURN_ID, False),
    (sc.STEP, True),
    (sc.NODE_TYPE, False),
    (sc.GEN_AI_PROVIDER_NAME, False),  # or gen_ai.system, below
    (sc.GEN_AI_REQUEST_MODEL, False),
    (sc.GEN_AI_RESPONSE_MODEL, False),
    (sc.GEN_AI_TOOL_NAME, False),
    (sc.GEN_AI_TOOL_CALL_ID, False),
    (sc.GEN_AI_USAGE_INPUT_TOKENS, True),
    (sc.GEN_AI_USAGE_OUTPUT_TOKENS, True),
    (sc.CHAIN_ID, False),
    (sc.CHAIN_SEQ, True),
    (sc.CHAIN_PREV, False),
    (sc.CHAIN_HASH, False),
    (sc.CHAIN_EPOCH, True),
]
_SLOT = {key: (i, as_int) for i, (key, as_int) in enumerate(_PROMOTED)}
_PROVIDER_SLOT = _SLOT[sc.GEN_AI_PROVIDER_NAME][0]
_NO_PROMOTED = (None,) * len(_PROMOTED)

# --- attribute sets from raw KeyValue bytes ----------------------------------------------------
#
# A KeyValue (as bytes) maps to (key, '"key":{typed value}', promoted value). Pairs up to
# _CACHED_KV_BYTES long are cached: they repeat across spans (names, models, ids of the run, small
# numbers); longer values (messages, prompts) are parsed every time. An attribute set is then the
# pieces of its last-occurring keys in sorted order, joined: exactly what
# ``orjson.dumps(anyvalue.attrs_from_proto(...), option=OPT_SORT_KEYS)`` gives. The order (a "plan")
# depends only on the tuple of keys, which spans of one kind share, so it is cached too.
#
# A value enters a cache the second time it misses: the first miss only notes its hash in a "seen
# once" set (a hash collision merely admits a value early). Values that never repeat (response ids,
# message text, streamed segments) then stay out of the caches instead of filling them until they
# are cleared, which would drop the repeated entries too. Not a cap per key: run, session and turn
# ids take new values forever, each repeated within its run.

_CACHED_KV_BYTES = 256
_CACHE_ENTRIES = 16_384  # per cache; cleared when full (a few MB at most)
_SEEN_ENTRIES = 16_384  # hashes per "seen once" set; cleared when full
_KV_CACHE: dict[bytes, tuple[str, str, Any]] = {}
_KV_SEEN: set[int] = set()
_PLAN_CACHE: dict[tuple[str, ...], tuple[Any, Any, int | None]] = {}
_RESOURCE_CACHE: dict[tuple, tuple[tuple, str | None]] = {}
_kv_cached = _KV_CACHE.get


_KEY_PREFIX: dict[str, str] = {}


def _varint(raw: bytes, p: int) -> tuple[int, int]:
    """The varint at ``p`` and the position after it (-1 when it runs past the end or past 5 bytes)."""
    value = shift = 0
    for q in range(p, min(p + 5, len(raw))):
        b = raw[q]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, q + 1
        shift += 7
    return 0, -1


def _string_kv(raw: bytes) -> tuple[str, str] | None:
    """(key, value) of a KeyValue laid out the way protobuf writes one with a non-empty string value:
    the key (field 1), then the value (field 2) holding only ``string_value`` (field 1). Reading it
    here spares parsing the message and copying the value out of it, which for long values (messages,
    prompts) is most of their cost. None for any other layout, and for text that is not UTF-8 (strict,
    as protobuf checks it): those go through ``KeyValue``, which decodes or raises as it always did."""
    n = len(raw)
    if n < 7 or raw[0] != 0x0A:
        return None
    klen = raw[1]
    if klen >= 0x80:
        return None
    p = 2 + klen
    try:
        # the value (field 2), then its string_value (field 1): each runs to the end of ``raw``; lengths
        # of one or two bytes are read inline (values up to 16 KB), longer ones with _varint
        for tag in (0x12, 0x0A):
            if raw[p] != tag:
                return None
            b = raw[p + 1]
            if b < 0x80:
                p += 2
                if p + b != n:
                    return None
            else:
                c = raw[p + 2]
                if c < 0x80:
                    p += 3
                    if p + ((b & 0x7F) | c << 7) != n:
                        return None
                else:
                    length, p = _varint(raw, p + 1)
                    if p < 0 or p + length != n:
                        return None
        if p == n:  # an empty string value
            return None
        return raw[2:2 + klen].decode(), raw[p:].decode()
    except (IndexError, UnicodeDecodeError):
        return None


def _string_piece(key: str, s: str) -> tuple[str, str, Any]:
    """(key, JSON member, promoted value) of a non-empty string value."""
    prefix = _KEY_PREFIX.get(key)
    if prefix is None:
        prefix = orjson.dumps(key).decode() + ':{"s":'
        if len(_KEY_PREFIX) < _CACHE_ENTRIES:
            _KEY_PREFIX[key] = prefix
    piece = f"{prefix}{orjson.dumps(s).decode()}}}"
    slot = _SLOT.get(key)
    if slot is not None:
        value = _int({"s": s}) if slot[1] else s
    else:
        value = s if key == sc.GEN_AI_SYSTEM else None
    return key, piece, value


def _kv_entry(raw: bytes) -> tuple[str, str, Any]:
    """Decode one KeyValue (``DecodeError`` if it is not one) to (key, JSON member, promoted value)."""
    plain = _string_kv(raw)
    if plain is not None:
        entry = _string_piece(*plain)
        if len(raw) <= _CACHED_KV_BYTES:
            _admit(_KV_CACHE, _KV_SEEN, raw, entry)
        return entry
    kv = KeyValue.FromString(raw)
    key = kv.key
    v = kv.value
    s = v.string_value
    if s:  # most values: skip WhichOneof and the dict encoding
        entry = _string_piece(key, s)
    else:
        typed = _typed(v)
        piece = orjson.dumps({key: typed}, option=_SORT)[1:-1].decode()
        slot = _SLOT.get(key)
        if slot is not None:
            value = _int(typed) if slot[1] else _text(typed)
        elif key == sc.GEN_AI_SYSTEM:
            value = _text(typed)
        else:
            value = None
        entry = (key, piece, value)
    if len(raw) <= _CACHED_KV_BYTES:
        _admit(_KV_CACHE, _KV_SEEN, raw, entry)
    return entry


def _admit(cache: dict[Any, Any], seen: set[int], key: Any, value: Any) -> None:
    """Cache ``value`` under ``key`` on its second miss; on the first, only note the key's hash.
    Both are bounded: cleared when full."""
    h = hash(key)
    if h in seen:
        if len(cache) >= _CACHE_ENTRIES:
            cache.clear()
        cache[key] = value
    else:
        if len(seen) >= _SEEN_ENTRIES:
            seen.clear()
        seen.add(h)


def _one(i: int) -> Any:
    return lambda seq: (seq[i],)


def _plan(keys: tuple[str, ...]) -> tuple[Any, Any, int | None]:
    """For a sequence of keys: (pick the JSON members in output order, pick the promoted values,
    position of gen_ai.system when it backs up an empty gen_ai.provider.name)."""
    last = {k: i for i, k in enumerate(keys)}  # a repeated key: the last one wins
    order = [last[k] for k in sorted(last)]
    pick = itemgetter(*order) if len(order) > 1 else _one(order[0])
    n = len(keys)  # the position of the None appended to the promoted values
    positions = [last.get(k, n) for k, _ in _PROMOTED]
    fallback = None
    system = last.get(sc.GEN_AI_SYSTEM)
    if system is not None:
        if positions[_PROVIDER_SLOT] == n:
            positions[_PROVIDER_SLOT] = system
        else:
            fallback = system
    promote = None if all(p == n for p in positions) else itemgetter(*positions)
    plan = (pick, promote, fallback)
    if len(_PLAN_CACHE) >= _CACHE_ENTRIES:
        _PLAN_CACHE.clear()
    _PLAN_CACHE[keys] = plan
    return plan


def _attrs_json(raws: Any) -> str:
    """Typed JSON of a repeated KeyValue given as raw bytes."""
    if not raws:
        return "{}"
    entries = [_kv_cached(r) or _kv_entry(r) for r in raws]
    keys, pieces, _ = zip(*entries)
    plan = _PLAN_CACHE.get(keys) or _plan(keys)
    return "{" + ",".join(plan[0](pieces)) + "}"


# A whole attribute set of a link, as the tuple of its raw KeyValues, maps to its JSON when the set
# is short: one lookup replaces a lookup per pair, the plan and the join. (Events of one kind repeat
# theirs from span to span too: sequence numbers, reasons, short segments; they are cached whole,
# all but their time, below.)
_CACHED_SET_BYTES = 512
_SET_CACHE: dict[tuple[bytes, ...], str] = {}
_SET_SEEN: set[int] = set()
_set_cached = _SET_CACHE.get


def _set_json(raws: tuple[bytes, ...]) -> str:
    """``_attrs_json`` of a set missing from ``_SET_CACHE``, kept there if short and seen before
    (only once decoded)."""
    attributes = _attrs_json(raws)
    if sum(map(len, raws)) <= _CACHED_SET_BYTES:
        _admit(_SET_CACHE, _SET_SEEN, raws, attributes)
    return attributes


# An event as protobuf writes it starts with its time (field 1, fixed64: tag 0x09 and 8 bytes); the
# rest (name, attributes, dropped count) repeats from span to span for events of one kind. That rest
# maps to (name, attributes JSON, dropped count), so a repeated event costs a slice and a lookup
# instead of a parse. A rest enters the cache (on its second miss, like the sets) only when it holds
# nothing but those fields in protobuf's own layout, so the event's time is always its first 9 bytes.
_CACHED_EVENT_BYTES = 640
_EVENT_CACHE: dict[bytes, tuple[str, str, int]] = {}
_EVENT_SEEN: set[int] = set()
_event_cached = _EVENT_CACHE.get
_parse_event = otlpwire.Event.FromString


def _event_fields(raw: bytes) -> tuple[int, str, str, int]:
    """(time, name, attributes JSON, dropped count) of a serialized event missing from
    ``_EVENT_CACHE`` (``DecodeError`` if it is not an event)."""
    ev = _parse_event(raw)
    # not through _SET_CACHE: a set that repeats comes with a tail that repeats, cached above
    fields = (ev.name, _attrs_json(ev.attributes[:]), ev.dropped_attributes_count)
    if 9 < len(raw) <= _CACHED_EVENT_BYTES and raw[0] == 0x09:
        _admit_tail(raw[9:], fields)
    return (ev.time_unix_nano, *fields)


def _admit_tail(tail: bytes, fields: tuple[str, str, int]) -> None:
    """Note (or, seen before, cache) the fields of an event's tail: admitted only when its layout is plain."""
    if hash(tail) not in _EVENT_SEEN or _plain_tail(tail):
        _admit(_EVENT_CACHE, _EVENT_SEEN, tail, fields)


def _plain_tail(tail: bytes) -> bool:
    """Whether ``tail`` holds only an event's name, attributes and dropped count, laid out as
    protobuf writes them (no time field, no unknown field, nothing written twice)."""
    try:
        msg = otlpwire.EventTail.FromString(tail)
    except _ProtoDecodeError:
        return False
    msg.DiscardUnknownFields()
    return msg.SerializeToString() == tail


def _source(request: Any) -> Any:
    """Serialized bytes, or an ``otlpwire.TracesRequest`` given as such (an OTLP message is serialized)."""
    if isinstance(request, bytes):
        return request
    if isinstance(request, (bytearray, memoryview)):
        return bytes(request)
    if isinstance(request, otlpwire.TracesRequest):
        return request
    return request.SerializeToString()


def traces_to_tables(requests: Iterable[Any], problems: dict[str, int] | None = None, *,
                     compiled: bool | None = None) -> Tables:
    """Convert trace requests (serialized ``ExportTraceServiceRequest`` bytes, OTLP messages, or
    ``otlpwire`` messages) to spans/span_events/span_links/resources.

    With a ``problems`` dict, spans with invalid ids are left out and counted there by reason
    (``span_problem``); without one every span is converted. Raises
    ``google.protobuf.message.DecodeError`` when a request (or an attribute in it) does not decode.
    ``compiled``: None uses the compiled span walk when it is built, False never, True requires it
    (the rows are the same either way).
    """
    if compiled and _spanwalk is None:
        raise RuntimeError("the compiled span walk (otel_agenttape.store._spanwalk) is not built")
    walk = False if compiled is False else None
    # Millions of short-lived objects would trigger the cyclic GC over and over; none form cycles.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _traces_to_tables([_source(r) for r in requests], problems, walk)
    finally:
        if was_enabled:
            gc.enable()


_ZERO_TRACE = otlpwire.ZERO_TRACE_ID
_ZERO_SPAN = otlpwire.ZERO_SPAN_ID
span_problem = otlpwire.span_problem
_KIND_MIN, _KIND_MAX = otlpwire.KIND_MIN, otlpwire.KIND_MAX


def _decode_only(span: Any) -> None:
    """Decode the attributes of a span that is left out, so a malformed one still fails the request."""
    _attrs_json(span.attributes[:])
    for raw in span.events:
        _attrs_json(_parse_event(raw).attributes[:])
    for ln in span.links:
        _attrs_json(ln.attributes[:])


class _Conversion:
    """The rows of one conversion so far, and what it has seen (for "first wins" and problems)."""

    def __init__(self, problems: dict[str, int] | None, columns: Any = None) -> None:
        self.columns = columns  # the compiled transposition, or None for zip
        self.span_rows: list[tuple] = []
        self.event_rows: list[tuple] = []
        self.link_rows: list[tuple] = []
        self.res = _Resources()
        self.seen: set[bytes] = set()
        self.dups = 0
        self.problems = problems

    def tables(self) -> Tables:
        return Tables(
            spans=_table("spans", self.span_rows, self.columns),
            span_events=_table("span_events", self.event_rows, self.columns),
            span_links=_table("span_links", self.link_rows, self.columns),
            resources=self.res.table(),
            log_records=_empty("log_records"),
            in_batch_duplicates=self.dups,
        )

    def add_span(self, span: Any, rid: str, scope_name: str | None, scope_version: str | None,
                 service: str | None) -> None:
        """One ``otlpwire`` span: its row, its events' and links' rows (or a problem, or a repeat).
        ``_spanwalk`` does the same for spans in protobuf's own layout; the tests hold them equal."""
        tid_b = span.trace_id
        sid_b = span.span_id
        parent = span.parent_span_id
        links = span.links
        problems = self.problems
        if problems is not None and (
            len(tid_b) != 16 or len(sid_b) != 8 or tid_b == _ZERO_TRACE or sid_b == _ZERO_SPAN
            or (parent and len(parent) != 8)
            or (links and any(len(ln.trace_id) != 16 or len(ln.span_id) != 8 for ln in links))
            or not _KIND_MIN <= span.kind <= _KIND_MAX
        ):
            why = span_problem(span) or "invalid ids"
            problems[why] = problems.get(why, 0) + 1
            _decode_only(span)
            return
        key = tid_b + sid_b
        if key in self.seen:
            self.dups += 1
            _decode_only(span)
            return
        self.seen.add(key)
        tid = tid_b.hex()
        sid = sid_b.hex()
        start = span.start_time_unix_nano
        end = span.end_time_unix_nano
        day = start // _NS_PER_DAY
        # a slice of a repeated field is a list made in C; iterating the field itself
        # goes item by item through the sequence protocol
        raws = span.attributes[:]
        if raws:
            entries = [_kv_cached(r) or _kv_entry(r) for r in raws]
            keys, pieces, values = zip(*entries)
            plan = _PLAN_CACHE.get(keys) or _plan(keys)
            attributes = "{" + ",".join(plan[0](pieces)) + "}"
            if plan[1] is None:
                promoted = _NO_PROMOTED
            else:
                promoted = plan[1](values + (None,))
                if plan[2] is not None and promoted[_PROVIDER_SLOT] is None:
                    promoted = list(promoted)
                    promoted[_PROVIDER_SLOT] = values[plan[2]]
        else:
            attributes = "{}"
            promoted = _NO_PROMOTED
        status = span.status
        self.span_rows.append(
            (
                tid,
                sid,
                parent.hex() if parent else None,
                span.trace_state or None,
                span.flags,
                span.name,
                span.kind,
                start,
                end,
                (end - start) / 1e6,
                status.code,
                status.message or None,
                attributes,
                span.dropped_attributes_count,
                span.dropped_events_count,
                span.dropped_links_count,
                rid,
                scope_name,
                scope_version,
                service,
                *promoted,
                day,
            )
        )
        events = span.events
        if events:
            add_event = self.event_rows.append
            for i, raw in enumerate(events[:]):
                hit = _event_cached(raw[9:]) if raw and raw[0] == 0x09 else None
                if hit is not None:
                    add_event((tid, sid, i, int.from_bytes(raw[1:9], "little"), *hit, day))
                else:
                    add_event((tid, sid, i, *_event_fields(raw), day))
        if links:
            for i, ln in enumerate(links):
                raws = tuple(ln.attributes[:])
                self.link_rows.append(
                    (
                        tid,
                        sid,
                        i,
                        ln.trace_id.hex(),
                        ln.span_id.hex(),
                        ln.trace_state or None,
                        ln.flags,
                        _set_cached(raws) or _set_json(raws),
                        ln.dropped_attributes_count,
                        day,
                    )
                )


def _scope(conv: _Conversion, rs: Any, ss: Any) -> tuple[str, str | None, str | None, str | None]:
    """(resource id, scope name, scope version, service name) of one ``ScopeSpans``."""
    rid, service = conv.res.add_wire(rs.resource, rs.schema_url)
    scope = ss.scope
    if scope.attributes:
        _attrs_json(scope.attributes[:])  # not stored; decoded like the rest
    return rid, scope.name or None, scope.version or None, service


_spanwalk = native.load("otel_agenttape.store._spanwalk")


def _walk_caches(conv: _Conversion) -> Any:
    """What ``_spanwalk.walk`` shares with this module (its caches and routines), and its fallback:
    ``conv.add_span`` of the span parsed by protobuf."""
    def fallback(raw: bytes, rid: str, scope_name: str | None, scope_version: str | None,
                 service: str | None) -> None:
        conv.add_span(otlpwire.Span.FromString(raw), rid, scope_name, scope_version, service)

    return _spanwalk.Caches(sys.modules[__name__], fallback)


def _traces_to_tables(requests: list[Any], problems: dict[str, int] | None,
                      walk: Any = None) -> Tables:
    walk = walk if walk is not None else (_spanwalk.walk if _spanwalk is not None else False)
    conv = _Conversion(problems, _spanwalk.columns if walk else None)
    add_span = conv.add_span
    caches = None
    for request in requests:
        if walk and isinstance(request, bytes):
            if caches is None:
                caches = _walk_caches(conv)
            for rs in otlpwire.RawTracesRequest.FromString(request).resource_spans:
                for ss in rs.scope_spans:
                    walk(ss.spans[:], conv, _scope(conv, rs, ss), caches)
            continue
        if isinstance(request, bytes):
            request = otlpwire.parse_traces(request)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                rid, scope_name, scope_version, service = _scope(conv, rs, ss)
                for span in ss.spans:
                    add_span(span, rid, scope_name, scope_version, service)
    return conv.tables()


def log_id(resource_id_: str, scope_name: str, scope_version: str, record_bytes: bytes) -> str:
    """sha256 hex over the resource, the scope and the record's deterministic encoding."""
    h = hashlib.sha256()
    h.update(f"{resource_id_}\n{scope_name}\n{scope_version}\n".encode())
    h.update(record_bytes)
    return h.hexdigest()


def logs_to_tables(requests: Iterable[Any]) -> Tables:
    """Convert ``ExportLogsServiceRequest`` messages to log_records/resources."""
    rows: list[tuple] = []
    res = _Resources()
    seen: set[str] = set()
    dups = 0
    for request in requests:
        for rl in request.resource_logs:
            rid, service = res.add(rl.resource, rl.schema_url)
            for sl in rl.scope_logs:
                scope_name = sl.scope.name
                scope_version = sl.scope.version
                for rec in sl.log_records:
                    lid = log_id(rid, scope_name, scope_version, rec.SerializeToString(deterministic=True))
                    if lid in seen:
                        dups += 1
                        continue
                    seen.add(lid)
                    t = rec.time_unix_nano or None
                    observed = rec.observed_time_unix_nano or None
                    when = t or observed or 0
                    body = (
                        orjson.dumps(_typed(rec.body), option=_SORT).decode() if rec.HasField("body") else None
                    )
                    rows.append(
                        (
                            lid,
                            t,
                            observed,
                            rec.severity_number,
                            rec.severity_text or None,
                            rec.event_name or None,
                            body,
                            orjson.dumps(_typed_attrs(rec.attributes), option=_SORT).decode(),
                            rec.trace_id.hex() or None,
                            rec.span_id.hex() or None,
                            rec.flags,
                            rec.dropped_attributes_count,
                            rid,
                            scope_name or None,
                            scope_version or None,
                            service,
                            when // _NS_PER_DAY,
                        )
                    )
    return Tables(
        spans=_empty("spans"),
        span_events=_empty("span_events"),
        span_links=_empty("span_links"),
        resources=res.table(),
        log_records=_table("log_records", rows),
        in_batch_duplicates=dups,
    )
