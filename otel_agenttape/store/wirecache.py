"""Attribute sets of OTLP spans from raw ``KeyValue`` bytes, through caches: the ingest fast path.

The reference encoding is ``dumps(attrs_from_proto(...))`` of ``codec.typed`` (typed JSON, keys
sorted); ``attrs_json`` gives the same text byte for byte (``tests/test_store_rows.py`` checks it).
``rows.py`` converts spans with these routines, and the compiled walk (``_spanwalk.pyx``) consults the
same caches: ``CACHES`` is what it is given, explicitly (the caches, their limits and the routines that
fill them), so it reads no private name of either module.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import orjson
from google.protobuf.message import DecodeError as _ProtoDecodeError
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from otel_agenttape import semconv as sc
from otel_agenttape.codec import otlp_view
from otel_agenttape.codec.typed import as_int, as_text, from_proto
from otel_agenttape.store.tables import NO_PROMOTED, PROMOTED, PROVIDER_SLOT, SLOT

_SORT = orjson.OPT_SORT_KEYS

# A KeyValue (as bytes) maps to (key, '"key":{typed value}', promoted value). Pairs up to
# CACHED_KV_BYTES long are cached: they repeat across spans (names, models, ids of the run, small
# numbers); longer values (messages, prompts) are parsed every time. An attribute set is then the
# pieces of its last-occurring keys in sorted order, joined: exactly what
# ``orjson.dumps(typed.attrs_from_proto(...), option=OPT_SORT_KEYS)`` gives. The order (a "plan")
# depends only on the tuple of keys, which spans of one kind share, so it is cached too.
#
# A value enters a cache the second time it misses: the first miss only notes its hash in a "seen
# once" set (a hash collision merely admits a value early). Values that never repeat (response ids,
# message text, streamed segments) then stay out of the caches instead of filling them until they
# are cleared, which would drop the repeated entries too. Not a cap per key: run, session and turn
# ids take new values forever, each repeated within its run.

CACHED_KV_BYTES = 256
CACHE_ENTRIES = 16_384  # per cache; cleared when full (a few MB at most)
SEEN_ENTRIES = 16_384  # hashes per "seen once" set; cleared when full
KV_CACHE: dict[bytes, tuple[str, str, Any]] = {}
KV_SEEN: set[int] = set()
PLAN_CACHE: dict[tuple[str, ...], tuple[Any, Any, int | None]] = {}
RESOURCE_CACHE: dict[tuple, tuple[tuple, str | None]] = {}
kv_cached = KV_CACHE.get


KEY_PREFIX: dict[str, str] = {}


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


def string_kv(raw: bytes) -> tuple[str, str] | None:
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


def string_piece(key: str, s: str) -> tuple[str, str, Any]:
    """(key, JSON member, promoted value) of a non-empty string value."""
    prefix = KEY_PREFIX.get(key)
    if prefix is None:
        prefix = orjson.dumps(key).decode() + ':{"s":'
        if len(KEY_PREFIX) < CACHE_ENTRIES:
            KEY_PREFIX[key] = prefix
    piece = f"{prefix}{orjson.dumps(s).decode()}}}"
    slot = SLOT.get(key)
    if slot is not None:
        value = as_int({"s": s}) if slot[1] else s
    else:
        value = s if key == sc.GEN_AI_SYSTEM else None
    return key, piece, value


def kv_entry(raw: bytes) -> tuple[str, str, Any]:
    """Decode one KeyValue (``DecodeError`` if it is not one) to (key, JSON member, promoted value)."""
    plain = string_kv(raw)
    if plain is not None:
        entry = string_piece(*plain)
        if len(raw) <= CACHED_KV_BYTES:
            admit(KV_CACHE, KV_SEEN, raw, entry)
        return entry
    kv = KeyValue.FromString(raw)
    key = kv.key
    v = kv.value
    s = v.string_value
    if s:  # most values: skip WhichOneof and the dict encoding
        entry = string_piece(key, s)
    else:
        typed = from_proto(v)
        piece = orjson.dumps({key: typed}, option=_SORT)[1:-1].decode()
        slot = SLOT.get(key)
        if slot is not None:
            value = as_int(typed) if slot[1] else as_text(typed)
        elif key == sc.GEN_AI_SYSTEM:
            value = as_text(typed)
        else:
            value = None
        entry = (key, piece, value)
    if len(raw) <= CACHED_KV_BYTES:
        admit(KV_CACHE, KV_SEEN, raw, entry)
    return entry


def admit(cache: dict[Any, Any], seen: set[int], key: Any, value: Any) -> None:
    """Cache ``value`` under ``key`` on its second miss; on the first, only note the key's hash.
    Both are bounded: cleared when full."""
    h = hash(key)
    if h in seen:
        if len(cache) >= CACHE_ENTRIES:
            cache.clear()
        cache[key] = value
    else:
        if len(seen) >= SEEN_ENTRIES:
            seen.clear()
        seen.add(h)


def _one(i: int) -> Any:
    return lambda seq: (seq[i],)


def make_plan(keys: tuple[str, ...]) -> tuple[Any, Any, int | None]:
    """For a sequence of keys: (pick the JSON members in output order, pick the promoted values,
    position of gen_ai.system when it backs up an empty gen_ai.provider.name)."""
    last = {k: i for i, k in enumerate(keys)}  # a repeated key: the last one wins
    order = [last[k] for k in sorted(last)]
    pick = itemgetter(*order) if len(order) > 1 else _one(order[0])
    n = len(keys)  # the position of the None appended to the promoted values
    positions = [last.get(k, n) for k, _ in PROMOTED]
    fallback = None
    system = last.get(sc.GEN_AI_SYSTEM)
    if system is not None:
        if positions[PROVIDER_SLOT] == n:
            positions[PROVIDER_SLOT] = system
        else:
            fallback = system
    promote = None if all(p == n for p in positions) else itemgetter(*positions)
    plan = (pick, promote, fallback)
    if len(PLAN_CACHE) >= CACHE_ENTRIES:
        PLAN_CACHE.clear()
    PLAN_CACHE[keys] = plan
    return plan


def attrs_json(raws: Any) -> str:
    """Typed JSON of a repeated KeyValue given as raw bytes."""
    if not raws:
        return "{}"
    entries = [kv_cached(r) or kv_entry(r) for r in raws]
    keys, pieces, _ = zip(*entries)
    plan = PLAN_CACHE.get(keys) or make_plan(keys)
    return "{" + ",".join(plan[0](pieces)) + "}"


# A whole attribute set of a link, as the tuple of its raw KeyValues, maps to its JSON when the set
# is short: one lookup replaces a lookup per pair, the plan and the join. (Events of one kind repeat
# theirs from span to span too: sequence numbers, reasons, short segments; they are cached whole,
# all but their time, below.)
CACHED_SET_BYTES = 512
SET_CACHE: dict[tuple[bytes, ...], str] = {}
SET_SEEN: set[int] = set()
set_cached = SET_CACHE.get


def set_json(raws: tuple[bytes, ...]) -> str:
    """``attrs_json`` of a set missing from ``SET_CACHE``, kept there if short and seen before
    (only once decoded)."""
    attributes = attrs_json(raws)
    if sum(map(len, raws)) <= CACHED_SET_BYTES:
        admit(SET_CACHE, SET_SEEN, raws, attributes)
    return attributes


# An event as protobuf writes it starts with its time (field 1, fixed64: tag 0x09 and 8 bytes); the
# rest (name, attributes, dropped count) repeats from span to span for events of one kind. That rest
# maps to (name, attributes JSON, dropped count), so a repeated event costs a slice and a lookup
# instead of a parse. A rest enters the cache (on its second miss, like the sets) only when it holds
# nothing but those fields in protobuf's own layout, so the event's time is always its first 9 bytes.
CACHED_EVENT_BYTES = 640
EVENT_CACHE: dict[bytes, tuple[str, str, int]] = {}
EVENT_SEEN: set[int] = set()
event_cached = EVENT_CACHE.get
parse_event = otlp_view.Event.FromString


def event_fields(raw: bytes) -> tuple[int, str, str, int]:
    """(time, name, attributes JSON, dropped count) of a serialized event missing from
    ``EVENT_CACHE`` (``DecodeError`` if it is not an event)."""
    ev = parse_event(raw)
    # not through SET_CACHE: a set that repeats comes with a tail that repeats, cached above
    fields = (ev.name, attrs_json(ev.attributes[:]), ev.dropped_attributes_count)
    if 9 < len(raw) <= CACHED_EVENT_BYTES and raw[0] == 0x09:
        admit_tail(raw[9:], fields)
    return (ev.time_unix_nano, *fields)


def admit_tail(tail: bytes, fields: tuple[str, str, int]) -> None:
    """Note (or, seen before, cache) the fields of an event's tail: admitted only when its layout is plain."""
    if hash(tail) not in EVENT_SEEN or plain_tail(tail):
        admit(EVENT_CACHE, EVENT_SEEN, tail, fields)


def plain_tail(tail: bytes) -> bool:
    """Whether ``tail`` holds only an event's name, attributes and dropped count, laid out as
    protobuf writes them (no time field, no unknown field, nothing written twice)."""
    try:
        msg = otlp_view.EventTail.FromString(tail)
    except _ProtoDecodeError:
        return False
    msg.DiscardUnknownFields()
    return msg.SerializeToString() == tail


class SharedCaches:
    """The caches above, their limits and the routines that fill them, as the compiled walk takes them
    (``_spanwalk.Caches`` reads these attributes once per conversion). The limits are read when asked,
    so a test that lowers one is seen."""

    __slots__ = ()
    kv_cache, kv_seen, plans, sets = KV_CACHE, KV_SEEN, PLAN_CACHE, SET_CACHE
    event_cache, event_seen, prefixes, slots = EVENT_CACHE, EVENT_SEEN, KEY_PREFIX, SLOT
    no_promoted, provider, system = NO_PROMOTED, PROVIDER_SLOT, sc.GEN_AI_SYSTEM
    kv_entry, string_piece, make_plan = staticmethod(kv_entry), staticmethod(string_piece), staticmethod(make_plan)
    event_fields, admit_tail, dumps = staticmethod(event_fields), staticmethod(admit_tail), staticmethod(orjson.dumps)
    cached_kv_bytes = property(lambda self: CACHED_KV_BYTES)
    cached_event_bytes = property(lambda self: CACHED_EVENT_BYTES)
    cache_entries = property(lambda self: CACHE_ENTRIES)
    seen_entries = property(lambda self: SEEN_ENTRIES)


CACHES = SharedCaches()
