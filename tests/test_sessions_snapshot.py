"""The snapshot format and the tape position it carries."""

from __future__ import annotations

from datetime import datetime, timezone

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_agenttape import semconv
from otel_agenttape.sessions import SessionSnapshot, TapePosition
from otel_agenttape.sessions.snapshot import SNAPSHOT_FORMAT


def _full_snapshot() -> SessionSnapshot:
    snap = SessionSnapshot(
        session_id="sess-1",
        agent="planner",
        memory={"facts": ["Paris is in France"], "n": 3, "pi": 3.5, "nested": {"ok": True, "none": None}},
        metadata={"user": "u1"},
    )
    snap.append_event({"type": "user", "text": "hello"})
    snap.append_event({"type": "assistant", "text": "hi ünïcødé ✓"})
    snap.append_event({"type": "user", "text": "plan a trip"})
    snap.record_run(
        "run-7",
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
        chain_id="chain-1",
        chain_seq=12,
        chain_hash="ab" * 32,
    )
    return snap


def test_round_trip_through_json_keeps_everything() -> None:
    snap = _full_snapshot()
    snap.compact("user greeted", upto=2)
    snap.updated_at = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=timezone.utc)
    snap.version = 4
    doc = orjson.loads(orjson.dumps(snap.to_dict()))
    assert doc["format"] == SNAPSHOT_FORMAT
    back = SessionSnapshot.from_dict(doc)
    assert back == snap
    assert back.tape.traceparent == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_unknown_format_is_refused() -> None:
    doc = _full_snapshot().to_dict()
    doc["format"] = 99
    with pytest.raises(ValueError, match="unknown session snapshot format 99"):
        SessionSnapshot.from_dict(doc)


def test_compact_replaces_events_and_counts_them() -> None:
    snap = _full_snapshot()
    first = snap.compact({"summary": "greeting"}, upto=2, model="small")
    assert first["events_compacted"] == 2 and first["first_event"] == 0 and first["model"] == "small"
    assert [e["text"] for e in snap.events] == ["plan a trip"]
    second = snap.compact("rest")
    assert second["first_event"] == 2 and second["events_compacted"] == 1
    assert snap.events == [] and snap.compacted_event_count() == 3
    with pytest.raises(TypeError):
        snap.append_event("not a dict")  # type: ignore[arg-type]


def test_tape_context_of_a_fresh_session_has_no_parent() -> None:
    ctx = SessionSnapshot(session_id="new", agent="a").tape_context()
    assert (ctx.session_id, ctx.agent, ctx.previous_run_id, ctx.traceparent) == ("new", "a", None, None)
    assert ctx.link() is None and ctx.otel_context() is None and ctx.carrier() == {}
    assert ctx.run_kwargs() == {"agent": "a", "session_id": "new"}


def test_tape_position_validates_ids() -> None:
    with pytest.raises(ValueError, match="trace_id"):
        TapePosition(run_id="r", trace_id="xyz", span_id="b7ad6b7169203331")
    with pytest.raises(ValueError, match="span_id"):
        TapePosition(run_id="r", trace_id="0af7651916cd43dd8448eb211c80319c", span_id="0" * 16)
    with pytest.raises(ValueError, match="go together"):
        TapePosition(run_id="r", trace_id="0af7651916cd43dd8448eb211c80319c")
    assert TapePosition(trace_id="0AF7651916CD43DD8448EB211C80319C", span_id="B7AD6B7169203331").trace_id == (
        "0af7651916cd43dd8448eb211c80319c"
    )


def test_position_from_a_real_sdk_span_and_continuation_objects() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span(
        "invoke_agent planner",
        attributes={semconv.RUN_ID: "run-1", semconv.SESSION_ID: "s", semconv.CHAIN_SEQ: 5, semconv.CHAIN_ID: "c"},
    ):
        pass
    (ended,) = exporter.get_finished_spans()
    snap = SessionSnapshot(session_id="s", agent="planner")
    snap.record_span(ended)
    sc = ended.get_span_context()
    assert snap.tape.run_id == "run-1" and snap.tape.chain_seq == 5 and snap.tape.chain_id == "c"
    assert snap.tape.traceparent == f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"

    ctx = snap.tape_context()
    assert ctx.previous_run_id == "run-1"
    link = ctx.link()
    assert (link.context.trace_id, link.context.span_id) == (sc.trace_id, sc.span_id)
    assert link.attributes[semconv.RUN_ID] == "run-1"
    # the same position continues a trace as parent too
    with tracer.start_as_current_span("invoke_agent planner", context=ctx.otel_context()):
        pass
    child = exporter.get_finished_spans()[-1]
    assert child.context.trace_id == sc.trace_id and child.parent.span_id == sc.span_id
    carrier = ctx.carrier()
    assert carrier["traceparent"] == snap.tape.traceparent
    from opentelemetry import baggage, propagate

    extracted = propagate.extract(carrier)
    assert baggage.get_baggage(semconv.RUN_ID, extracted) == "run-1"
    assert baggage.get_baggage(semconv.SESSION_ID, extracted) == "s"
    assert ctx.run_kwargs() == {"agent": "planner", "session_id": "s", "follows": carrier}
    assert ctx.run_attributes() == {
        semconv.SESSION_ID: "s",
        semconv.PREVIOUS_RUN_ID: "run-1",
        semconv.GEN_AI_AGENT_NAME: "planner",
    }
