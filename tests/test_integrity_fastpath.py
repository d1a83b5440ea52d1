"""The fast leaf paths give exactly the general path's bytes and findings.

Sealing renders the leaf of a live span with orjson sorting the keys (``leaf_fast.fast_leaf_sdk``);
verification serializes leaves straight from the stored typed JSON and keeps them only when they
reproduce the stored chain hash (``sealed_entries.batch_entries``). Both must agree with the general
projection (itself differential-tested against ``rfc8785``) on every span, and the verifier must
report the same entries, problems and reasons as the row-by-row path on untouched and edited rows.
"""

from __future__ import annotations

import math
import random

import duckdb
import orjson
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from integrity_support import edit_store, encode, sealed_provider, set_stored_attributes, stored_attributes
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from otel_agenttape import semconv
from otel_agenttape.integrity.leaf import leaf_bytes, project_sdk
from otel_agenttape.integrity.leaf_fast import fast_leaf_sdk, leaf_from_sdk
from otel_agenttape.store.reader import open_reader
from otel_agenttape.store.writer import Store
from otel_agenttape.tape import sealed_entries
from otel_agenttape.tape.sealed_rows import load_rows, query_rows, row_entry, to_compact
from otel_agenttape.tape.verification import verify_store

KEYS = ["a", "Z", "gen_ai.request.model", "\u00e9", "\u05d3", "\ue000", "\uffee", "\uffff", "\U0001f600",
        "\U00010000", "\ud800", "agenttape.chain.x", "k\n", "\u2028", "\x00"]
TEXTS = ["", "plain", "\x00\x1f\x7f", "\"\\/", "\u2028\u2029", "\ud800", "\udfff\ud800", "\ud83d\ude00",
         "\U0001f600", "e\u0301", "\ufeff", "\ue000"]
SCALARS = [0, -1, 2**63 - 1, -(2**63), 2**63, -(2**64), 2**53 + 1, 0.0, -0.0, math.nan, math.inf, -math.inf,
           1e-7, 1e21, 5e-324, 0.1, True, False, b"\x00\xff", bytearray(b"x")]
LIMITS = SpanLimits(max_attributes=10_000, max_events=10_000, max_links=1000, max_event_attributes=10_000,
                    max_link_attributes=10_000)
REMOTE = SpanContext(0x1F2E3D4C5B6A79881726354453627180, 0x0102030405060708, True,
                     TraceFlags(TraceFlags.SAMPLED), TraceState([("vendor", "v1")]))


def _value(rng: random.Random, depth: int = 0):
    pick = rng.random()
    if depth < 2 and pick < 0.15:
        return tuple(_value(rng, depth + 1) for _ in range(rng.randrange(4)))
    if depth < 2 and pick < 0.2:
        return [rng.choice(TEXTS) for _ in range(rng.randrange(3))]
    if pick < 0.6:
        return rng.choice(TEXTS) + rng.choice(TEXTS)
    return rng.choice(SCALARS)


def _attrs(rng: random.Random, n: int, adversarial: bool) -> dict:
    pool = KEYS if adversarial else KEYS[:5]
    return {"".join(rng.choice(pool) for _ in range(rng.randrange(1, 3))): _value(rng) if adversarial
            else rng.choice([rng.choice(TEXTS[:5]), 7, 0.5, True, ("x", "y")]) for _ in range(rng.randrange(n + 1))}


def _raw_spans(seed: int, n: int, adversarial: bool) -> list:
    """Spans straight from the SDK (not sealed, so values are not made OTLP-safe)."""
    rng = random.Random(seed)
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=LIMITS)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    for _ in range(n):
        span = tracer.start_span(rng.choice(TEXTS[:4] + ["chat"]), links=[Link(REMOTE, _attrs(rng, 2, adversarial))]
                                 if rng.random() < 0.3 else None)
        for k, v in _attrs(rng, 8, adversarial).items():
            span.set_attribute(k, v)
        for _ in range(rng.randrange(3)):
            span.add_event(rng.choice(["e", "\u00e9v", "\ud800"] if adversarial else ["e", "\u00e9v"]),
                           _attrs(rng, 3, adversarial))
        if rng.random() < 0.3:
            span.set_status(Status(StatusCode.ERROR, rng.choice(TEXTS if adversarial else TEXTS[:5])))
        span.end()
    provider.shutdown()
    return list(exporter.get_finished_spans())


def _general(span) -> bytes | None:
    try:
        return leaf_bytes(project_sdk(span))
    except Exception:  # noqa: BLE001 - no leaf: the span has no canonical form
        return None


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.booleans())
def test_fast_sdk_leaf_equals_general_leaf_and_rfc8785(seed, adversarial) -> None:
    fast_taken = 0
    for span in _raw_spans(seed, 25, adversarial):
        try:
            fast = fast_leaf_sdk(span)
        except Exception:  # noqa: BLE001 - the fast path may refuse; leaf_from_sdk then takes the general path
            fast = None
        general = _general(span)
        if fast is not None:
            fast_taken += 1
            assert fast == general == rfc8785.dumps(project_sdk(span))
        if general is not None:
            assert leaf_from_sdk(span) == general
    if not adversarial:
        assert fast_taken == 25  # plain values always take the fast path


def test_fast_path_refuses_what_it_cannot_order_or_type() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=LIMITS)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    cases = [{"\U0001f600": "x", "\ue000": "y"}, {"k": 2**64}, {"k": ("a", 2**70)}, {"agenttape.chain.seq": 1},
             {"k": "a\ud800"}]
    for attrs in cases:
        with tracer.start_as_current_span("s") as sp:
            for k, v in attrs.items():
                sp._attributes._dict[k] = v  # what a custom span could hold, bypassing SDK validation
    provider.shutdown()
    for span in exporter.get_finished_spans():
        try:
            fast = fast_leaf_sdk(span)
        except Exception:  # noqa: BLE001
            fast = None
        assert fast is None, dict(span.attributes)
    astral = exporter.get_finished_spans()[0]
    assert leaf_from_sdk(astral) == rfc8785.dumps(project_sdk(astral))  # UTF-16 order: the emoji key first


def test_keys_remembered_for_events_are_not_trusted_in_span_attributes() -> None:
    """The fast path remembers keys that passed its checks, apart for spans and for events/links: a
    chain key seen in an event (where it is covered) still sends a span holding it to the general path."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=LIMITS)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("event first") as sp:
        sp.add_event("e", {"agenttape.chain.seq": 1, "k": "v"})
    with tracer.start_as_current_span("attribute after") as sp:
        sp.set_attribute("k", "v")
        sp._attributes._dict["agenttape.chain.seq"] = 1  # bypassing the SDK, as a sealed copy holds it
    provider.shutdown()
    first, second = exporter.get_finished_spans()
    for _ in range(2):  # the second round finds every key remembered
        assert fast_leaf_sdk(first) == leaf_bytes(project_sdk(first))
        assert b"agenttape.chain.seq" in fast_leaf_sdk(first)
        try:
            fast = fast_leaf_sdk(second)
        except Exception:  # noqa: BLE001
            fast = None
        assert fast is None
        assert leaf_from_sdk(second) == leaf_bytes(project_sdk(second))
        assert b"agenttape.chain" not in leaf_from_sdk(second)


BMP_KEYS = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(BMP_KEYS, st.one_of(st.text(st.characters(exclude_categories=("Cs",)), max_size=8),
                                           st.booleans(), st.integers(0, 1000)), max_size=12))
def test_orjson_key_sort_is_rfc8785_order_without_astral_keys(d) -> None:
    assert orjson.dumps(d, option=orjson.OPT_SORT_KEYS) == rfc8785.dumps(d)


# --- verification -----------------------------------------------------------------------------------


def _record(run_id: str, n: int = 10):
    provider, sealer, exporter = sealed_provider(checkpoint_every=4)
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: run_id}):
        for i in range(n):
            links = [Link(REMOTE, {"why": "retry", "n": i})] if i % 3 == 0 else None
            with tracer.start_as_current_span(f"node {i}", links=links, attributes={
                semconv.NODE_TYPE: "tool", semconv.STEP: i, "payload": f"v{i} \u00e9\u2028", "ratio": i / 3,
                "blob": bytes([i]), "tags": ("a", "b"), "\ue000": "pua", "\U0001f600" if i == 4 else "z": "astral",
                "nested": {"k": [1, "x"]} if i == 5 else "flat",
            }) as sp:
                sp.add_event("agenttape.text", {"agenttape.seq": i, "text": "h\u00e9llo"})
                sp.add_event("second")
    provider.shutdown()
    assert sealer.errors == 0
    return exporter.get_finished_spans()


def _entries_both_ways(db: str):
    reader = open_reader(db)
    try:
        spans, ev_by, lk_by = query_rows(reader, "chain_id IS NOT NULL", [])
        fast = [t for rb in spans.to_batches(max_chunksize=5) for t in sealed_entries.batch_entries(rb, ev_by, lk_by)]
        general = [to_compact(*row_entry(row)) for row in load_rows(reader)]
        reports = verify_store(reader)
    finally:
        reader.close()
    return sorted(fast, key=repr), sorted(general, key=repr), reports


@pytest.fixture()
def db(tmp_path):
    path = str(tmp_path / "tape.duckdb")
    store = Store(path)
    store.write_traces([encode(_record("run-f"))])
    store.close()
    return path


def test_untouched_rows_take_the_fast_path_and_match_the_general_path(db, monkeypatch) -> None:
    fast, general, reports = _entries_both_ways(db)
    assert fast == general
    assert all(t[9] is None for t in fast) and len(fast) == 11
    assert reports[0].valid
    calls = []
    real = sealed_entries.row_entry
    monkeypatch.setattr(sealed_entries, "row_entry", lambda row: calls.append(row) or real(row))
    reader = open_reader(db)
    try:
        spans, ev_by, lk_by = query_rows(reader, "chain_id IS NOT NULL", [])
        for rb in spans.to_batches():
            sealed_entries.batch_entries(rb, ev_by, lk_by)
    finally:
        reader.close()
    assert len(calls) == 1  # only the span whose astral key sorts differently in UTF-16


EDITS = {
    "value edited": lambda a: (a.__setitem__("payload", {"s": "forged"}), orjson.dumps(a).decode())[1],
    "keys reversed (same content)": lambda a: orjson.dumps(dict(reversed(list(a.items())))).decode(),
    "whitespace (same content)": lambda a: orjson.dumps(a, option=orjson.OPT_INDENT_2).decode(),
    "escaped text (same content)": lambda a: orjson.dumps(a).decode().replace('"payload"', '"p\\u0061yload"'),
    "extra chain key": lambda a: (a.__setitem__("agenttape.chain.extra", {"s": "x"}), orjson.dumps(a).decode())[1],
    "chain key nested": lambda a: orjson.dumps({**{k: v for k, v in a.items() if k != semconv.CHAIN_ID},
                                                "x": {"kv": {semconv.CHAIN_ID: a[semconv.CHAIN_ID]}}}).decode(),
    "chain key missing": lambda a: orjson.dumps({k: v for k, v in a.items() if k != semconv.CHAIN_SEQ}).decode(),
    "seq typed as string": lambda a: (a.__setitem__(semconv.CHAIN_SEQ, {"s": "3", "i": "3"}),
                                      orjson.dumps(a).decode())[1],
    "duplicate key": lambda a: orjson.dumps(a).decode()[:-1] + ',"payload":{"s":"dup"}}',
    "not an object": lambda a: "[1,2]",
}


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_edited_rows_give_the_general_path_findings(db, edit) -> None:
    seq = 3
    set_stored_attributes(db, seq, EDITS[edit](stored_attributes(db, seq)))
    fast, general, reports = _entries_both_ways(db)
    assert fast == general
    undetectable = "(same content)" in edit or edit == "extra chain key"  # agenttape.chain.* is not hashed
    assert reports[0].valid is undetectable, reports[0].reason
    if not undetectable:
        assert reports[0].first_broken_index == seq


@pytest.mark.parametrize("sql", [
    "UPDATE spans SET chain_hash = 'ff' || substr(chain_hash, 3) WHERE chain_seq = 2",
    "UPDATE spans SET chain_epoch = 1 WHERE chain_seq = 2",
    "UPDATE spans SET name = 'renamed' WHERE chain_seq = 2",
    "UPDATE spans SET kind = 3 WHERE chain_seq = 2",
    "UPDATE spans SET trace_state = 'a=b' WHERE chain_seq = 2",
    ("UPDATE span_events SET attributes = '{\"text\":{\"s\":\"x\"}}' WHERE event_index = 0 AND span_id = "
     "(SELECT span_id FROM spans WHERE chain_seq = 2)"),
    ("UPDATE span_links SET linked_span_id = '00000000000000ff' WHERE span_id = "
     "(SELECT span_id FROM spans WHERE chain_seq = 3)"),
    "UPDATE span_events SET event_index = 1 - event_index WHERE span_id = (SELECT span_id FROM spans WHERE chain_seq = 2)",
])
def test_edited_columns_give_the_general_path_findings(db, sql) -> None:
    edit_store(db, sql)
    fast, general, reports = _entries_both_ways(db)
    assert fast == general
    assert not reports[0].valid


def test_remembered_int_forms_never_stand_for_bools_or_doubles() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    values = [1, True, 1.0, 0, False, 0.0, -0.0, 1, 2**63 - 1, -(2**63), True, 0]
    for v in values:
        with tracer.start_as_current_span("s", attributes={"x": v, "y": (v,) if type(v) is not int else v}):
            pass
    provider.shutdown()
    spans = exporter.get_finished_spans()
    for span, v in zip(spans, values):
        leaf = leaf_from_sdk(span)
        assert leaf == _general(span) == rfc8785.dumps(project_sdk(span))
        typed = orjson.loads(leaf)["attributes"]["x"]
        assert typed == ({"bool": v} if type(v) is bool else {"i": str(v)} if type(v) is int else {"d": repr(v)})


# --- leaf v2 rows (salted content values) ----------------------------------------------------------


def _record_v2(run_id: str, n: int = 6):
    provider, sealer, exporter = sealed_provider(checkpoint_every=4)
    tracer = provider.get_tracer("otel_agenttape")
    with tracer.start_as_current_span("run", attributes={semconv.RUN_ID: run_id}):
        for i in range(n):
            with tracer.start_as_current_span(f"chat {i}", attributes={
                semconv.NODE_TYPE: "model", semconv.STEP: i, "payload": f"v{i}",
                semconv.GEN_AI_INPUT_MESSAGES: f'[{{"role":"user","content":"secret {i} \u00e9"}}]',
            }) as sp:
                sp.add_event(semconv.EVENT_TEXT, {semconv.EVENT_SEQ: 0, semconv.EVENT_SEGMENT: f"part {i}"})
    provider.shutdown()
    assert sealer.errors == 0
    return exporter.get_finished_spans()


@pytest.fixture()
def db_v2(tmp_path):
    path = str(tmp_path / "tape_v2.duckdb")
    store = Store(path)
    store.write_traces([encode(_record_v2("run-v2"))])
    store.close()
    return path


def test_v2_rows_take_the_fast_path_and_match_the_general_path(db_v2, monkeypatch) -> None:
    fast, general, reports = _entries_both_ways(db_v2)
    assert fast == general and len(fast) == 7 and reports[0].valid
    salted = stored_attributes(db_v2, 2)[semconv.CHAIN_SALTS]["s"]
    assert set(orjson.loads(salted)) == {semconv.GEN_AI_INPUT_MESSAGES, f"event:0:{semconv.EVENT_SEGMENT}"}
    calls = []
    real = sealed_entries.row_entry
    monkeypatch.setattr(sealed_entries, "row_entry", lambda row: calls.append(row) or real(row))
    reader = open_reader(db_v2)
    try:
        spans, ev_by, lk_by = query_rows(reader, "chain_id IS NOT NULL", [])
        for rb in spans.to_batches():
            sealed_entries.batch_entries(rb, ev_by, lk_by)
    finally:
        reader.close()
    assert calls == []  # every v2 row verified on the fast path


def _salts_edit(a: dict, fn) -> str:
    m = orjson.loads(a[semconv.CHAIN_SALTS]["s"])
    fn(a, m)
    a[semconv.CHAIN_SALTS] = {"s": orjson.dumps(m).decode()}
    return orjson.dumps(a).decode()


_MSG = semconv.GEN_AI_INPUT_MESSAGES
V2_EDITS = {
    "content edited": lambda a: (a.__setitem__(_MSG, {"s": "forged"}), orjson.dumps(a).decode())[1],
    "salt in upper case": lambda a: _salts_edit(a, lambda a, m: m.__setitem__(_MSG, m[_MSG].upper())),
    "salt kept, value removed": lambda a: _salts_edit(a, lambda a, m: a.pop(_MSG)),
    "salt removed, value kept": lambda a: _salts_edit(a, lambda a, m: m.pop(_MSG)),
    "erased without the record's map": lambda a: _salts_edit(a, lambda a, m: (a.pop(_MSG), m.pop(_MSG))),
}


@pytest.mark.parametrize("edit", list(V2_EDITS), ids=list(V2_EDITS))
def test_edited_v2_rows_give_the_general_path_findings(db_v2, edit) -> None:
    seq = 3
    set_stored_attributes(db_v2, seq, V2_EDITS[edit](stored_attributes(db_v2, seq)))
    fast, general, reports = _entries_both_ways(db_v2)
    assert fast == general
    assert not reports[0].valid and reports[0].first_broken_index == seq, reports[0].reason


def test_compiled_commitments_equal_the_python_loop(monkeypatch) -> None:
    """``_chain.commit_salts`` (compiled) and the Python loop of ``sealed_entries._commit`` agree, and
    both refuse salts the reference refuses."""
    if sealed_entries._native_commit is None:
        pytest.skip("compiled chain not built")
    rng = random.Random(7)
    for _ in range(200):
        attrs = {"k": {"s": rng.choice(TEXTS[:5]) * rng.randrange(1, 400)}, "n": {"i": "3"},
                 "arr": {"a": [{"s": "x"}, {"i": "1"}]}}
        events = [{"attributes": {"seg": {"s": rng.choice(TEXTS[:5])}}}]
        salts = {"k": rng.randbytes(16).hex(), "arr": rng.randbytes(16).hex(), "event:0:seg": rng.randbytes(16).hex()}
        st = {"s": orjson.dumps(salts).decode()}
        got = [dict(attrs), [{"attributes": dict(events[0]["attributes"])}]]
        sealed_entries._commit(got[0], got[1], st, None)
        with monkeypatch.context() as m:
            m.setattr(sealed_entries, "_native_commit", None)
            want = [dict(attrs), [{"attributes": dict(events[0]["attributes"])}]]
            sealed_entries._commit(want[0], want[1], st, None)
        assert got == want and "c" in got[0]["k"] and "c" in got[1][0]["attributes"]["seg"]
    for bad in ("A" * 32, "a" * 31 + " ", "a" * 30, "g" * 32):
        for native in (True, False):
            with monkeypatch.context() as m:
                if not native:
                    m.setattr(sealed_entries, "_native_commit", None)
                with pytest.raises((sealed_entries._General, ValueError)):  # either way: the general path
                    sealed_entries._commit({"k": {"s": "v"}}, [], {"s": orjson.dumps({"k": bad}).decode()}, None)


def test_compiled_commitments_hash_every_text_as_orjson_writes_it(monkeypatch) -> None:
    """The compiled path hashes a text value while escaping it: every control character, quotes,
    backslashes, non-ASCII and lone surrogates give the Python loop's commitment or its refusal, and
    salts texts it does not parse itself (escaped or repeated labels, spaces) go through orjson."""
    if sealed_entries._native_commit is None:
        pytest.skip("compiled chain not built")
    texts = ["".join(chr(i) for i in range(128)), "a\nb\tc\rd\x0be\x0cf\x08g", "\u00e9\u2028\U0001f600\"x\\",
             "\ud800", "x\udfff", *TEXTS]
    salt = "0f" * 16

    def both(attrs: dict, st_text: str) -> tuple:
        out = []
        for native in (True, False):
            with monkeypatch.context() as m:
                if not native:
                    m.setattr(sealed_entries, "_native_commit", None)
                a = {k: dict(v) for k, v in attrs.items()}
                try:
                    sealed_entries._commit(a, [], {"s": st_text}, None)
                    out.append(a)
                except Exception as exc:  # noqa: BLE001 - the kind of refusal is what is compared
                    out.append(type(exc).__name__ if not isinstance(exc, sealed_entries._General) else "general")
        return tuple(out)

    for text in texts:
        native, python = both({"k": {"s": text}}, orjson.dumps({"k": salt}).decode())
        if isinstance(python, str):  # a lone surrogate: orjson refuses the value either way
            assert isinstance(native, str)
        else:
            assert native == python, repr(text)
    value = {"k": {"s": "v"}, "j": {"s": "w"}}
    for st_text in ('{"k":"%s"}' % salt, '{"k":"%s","j":"%s"}' % (salt, "1a" * 16),
                    '{ "k" : "%s" }' % salt, '{"\\u006b":"%s"}' % salt, '{"k":"%s","k":"%s"}' % ("00" * 16, salt),
                    '{"k":"%s",}' % salt, '{"k":"%s"' % salt, '{}', '[]', '{"k":"%s "}' % salt[:31]):
        native, python = both(value, st_text)
        assert native == python or (isinstance(native, str) and isinstance(python, str)), st_text


def test_compiled_commitments_never_take_one_layout_for_another(monkeypatch) -> None:
    """The compiled path remembers the last salts layout (labels and where the salts are); texts of the
    same length whose labels differ, or come in another order, are read as themselves."""
    if sealed_entries._native_commit is None:
        pytest.skip("compiled chain not built")
    s1, s2 = "0f" * 16, "a1" * 16
    texts = ['{"k":"%s","j":"%s"}' % (s1, s2), '{"j":"%s","k":"%s"}' % (s1, s2), '{"k":"%s","m":"%s"}' % (s1, s2),
             '{"k":"%s","j":"%s"}' % (s2, s1), '{"k":"%s","j":"%s"}' % (s1, s2.upper())]
    for st_text in texts * 2:
        got = []
        for native in (True, False):
            with monkeypatch.context() as m:
                if not native:
                    m.setattr(sealed_entries, "_native_commit", None)
                a = {"k": {"s": "v"}, "j": {"s": "w"}, "m": {"s": "x"}}
                try:
                    sealed_entries._commit(a, [], {"s": st_text}, None)
                    got.append(a)
                except (sealed_entries._General, ValueError):
                    got.append("general")
        assert got[0] == got[1], st_text
