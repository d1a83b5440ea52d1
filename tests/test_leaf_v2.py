"""Leaf v2: content values sealed as salted commitments survive SDK -> OTLP JSON -> store rows, the
compiled and Python paths agree, and erasure-shaped edits are caught or accepted as the spec says."""

from __future__ import annotations

import json

import orjson
import pytest
from integrity_support import encode, otlp_json
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags

from otel_agenttape import semconv
from otel_agenttape.capture.sealing import SealingSpanProcessor
from otel_agenttape.codec.otlp_decode import JSON, decode_traces
from otel_agenttape.integrity import Signer, leaf_from_proto, leaf_from_row, leaf_hash, link_hash
from otel_agenttape.integrity import leaf_fast
from otel_agenttape.integrity.leaf import CommitmentError, commitment_hex, parse_salts
from otel_agenttape.store.rows import traces_to_tables

SECRET = "my card is 4111 1111 1111 1111"


def _span(span_id: int) -> ReadableSpan:
    ctx = SpanContext(0xABC, span_id, False, TraceFlags(1))
    return ReadableSpan(
        name="chat m", context=ctx, attributes={
            semconv.RUN_ID: "r1", semconv.GEN_AI_INPUT_MESSAGES: json.dumps([{"role": "user", "content": SECRET}]),
            semconv.MODEL_OUTPUT_TEXT: "ok", "gen_ai.usage.input_tokens": 7},
        events=(Event(semconv.EVENT_TEXT, {semconv.EVENT_SEQ: 0, semconv.EVENT_SEGMENT: "ok"}, 5),),
        start_time=1_000, end_time=2_000)


def _sealed() -> ReadableSpan:
    exporter = InMemorySpanExporter()
    sealer = SealingSpanProcessor(SimpleSpanProcessor(exporter), signing_key=Signer.generate("t"),
                                  export_checkpoints=False)
    span = _span(0x11)
    sealer.on_start(span)
    sealer.on_end(span)
    (sealed,) = exporter.get_finished_spans()
    assert sealer.errors == 0
    return sealed


def _row(sealed: ReadableSpan) -> tuple[dict, object]:
    doc = json.loads(otlp_json(encode([sealed])))
    req = decode_traces(json.dumps(doc).encode(), JSON)
    (proto,) = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    tables = traces_to_tables([req])
    (row,) = tables.spans.to_pylist()
    row["events"] = tables.span_events.to_pylist()
    row["links"] = tables.span_links.to_pylist()
    return row, proto


def test_v2_leaf_commits_to_content_and_round_trips() -> None:
    sealed = _sealed()
    a = sealed.attributes
    salts = parse_salts(a[semconv.CHAIN_SALTS])
    assert set(salts) == {semconv.GEN_AI_INPUT_MESSAGES, semconv.MODEL_OUTPUT_TEXT, "event:0:agenttape.segment"}
    assert len({s for s in salts.values()}) == 3 and all(len(s) == 16 for s in salts.values())
    leaf = leaf_fast.leaf_from_sdk(sealed)
    assert b'"v":2' in leaf and SECRET.encode() not in leaf and b'"c":"' in leaf
    assert link_hash(a[semconv.CHAIN_PREV], leaf) == a[semconv.CHAIN_HASH]
    row, proto = _row(sealed)
    assert leaf_from_row(row, row["events"], row["links"]) == leaf
    assert leaf_from_proto(proto) == leaf


def test_erased_value_keeps_the_leaf_and_bad_erasures_are_caught() -> None:
    sealed = _sealed()
    row, _ = _row(sealed)
    leaf = leaf_from_row(row, row["events"], row["links"])
    attrs = orjson.loads(row["attributes"])
    key = semconv.GEN_AI_INPUT_MESSAGES
    salts = {k: v.hex() for k, v in parse_salts(attrs[semconv.CHAIN_SALTS]["s"]).items()}
    c = commitment_hex(bytes.fromhex(salts[key]), attrs[key])
    erased = dict(attrs)
    del erased[key]
    kept_salts = dict(salts)
    del salts[key]
    erased[semconv.CHAIN_SALTS] = {"s": json.dumps(salts)}
    erased[semconv.CHAIN_ERASED] = {"s": json.dumps({key: c})}
    ok = dict(row, attributes=orjson.dumps(erased).decode())
    assert leaf_from_row(ok, row["events"], row["links"]) == leaf  # value and salt gone: same leaf
    assert SECRET not in ok["attributes"]
    # a salt kept while its value was removed
    bad = dict(erased, **{semconv.CHAIN_SALTS: {"s": json.dumps(kept_salts)}})
    with pytest.raises(CommitmentError, match="salt kept"):
        leaf_from_row(dict(row, attributes=orjson.dumps(bad).decode()), row["events"], row["links"])
    # an edited value changes the leaf
    edited = dict(attrs, **{key: {"s": "edited"}})
    assert leaf_from_row(dict(row, attributes=orjson.dumps(edited).decode()), row["events"], row["links"]) != leaf
    # an erased value whose stored commitment was changed changes the leaf
    forged = dict(erased, **{semconv.CHAIN_ERASED: {"s": json.dumps({key: "0" * 64})}})
    assert leaf_from_row(dict(row, attributes=orjson.dumps(forged).decode()), row["events"], row["links"]) != leaf


def test_compiled_and_python_seal_the_same_leaf() -> None:
    span = _span(0x22)
    lh, text = leaf_fast.seal_hash_sdk(span)
    assert text is not None
    assert leaf_hash(leaf_fast.python_leaf_from_sdk(span, parse_salts(text))) == lh
    lh2, text2 = leaf_fast.python_seal_hash_sdk(span)
    assert text2 != text  # fresh salts each time
    assert leaf_hash(leaf_fast.python_leaf_from_sdk(span, parse_salts(text2))) == lh2
