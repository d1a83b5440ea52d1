"""Restoring a session continues its tape: a run in a new process carries the same session id and
links to the run recorded before the restart (OTel SDK spans, store reloaded in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_agenttape import semconv
from otel_agenttape.sessions import FileSessionStore, SessionSnapshot

CHILD = textwrap.dedent(
    """
    import json, sys
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from otel_agenttape import semconv
    from otel_agenttape.sessions import FileSessionStore, SqlSessionStore

    kind, where = sys.argv[1], sys.argv[2]
    store = FileSessionStore(where) if kind == "file" else SqlSessionStore(where)
    snap = store.load("chat-1")
    ctx = snap.tape_context()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent")
    attrs = {**ctx.run_attributes(), semconv.RUN_ID: "run-2"}
    with tracer.start_as_current_span("invoke_agent planner", attributes=attrs, links=[ctx.link()]) as span:
        snap.memory["turns"] += 1
        snap.append_event({"type": "user", "text": "and tomorrow?"})
    snap.record_span(exporter.get_finished_spans()[0])
    store.save(snap)
    (s,) = exporter.get_finished_spans()
    print(json.dumps({
        "trace_id": format(s.context.trace_id, "032x"),
        "span_id": format(s.context.span_id, "016x"),
        "attributes": dict(s.attributes),
        "links": [[format(l.context.trace_id, "032x"), format(l.context.span_id, "016x"), dict(l.attributes)] for l in s.links],
    }))
    """
)


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_restored_session_continues_its_tape_in_a_new_process(tmp_path, kind) -> None:
    where = str(tmp_path / "sessions") if kind == "file" else f"sqlite:///{tmp_path / 's.db'}"
    if kind == "file":
        store = FileSessionStore(where)
    else:
        from otel_agenttape.sessions import SqlSessionStore

        store = SqlSessionStore(where)

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent")
    snap = SessionSnapshot(session_id="chat-1", agent="planner", memory={"turns": 0})
    first_attrs = {**snap.tape_context().run_attributes(), semconv.RUN_ID: "run-1"}
    assert semconv.PREVIOUS_RUN_ID not in first_attrs
    with tracer.start_as_current_span("invoke_agent planner", attributes=first_attrs):
        snap.memory["turns"] += 1
        snap.append_event({"type": "user", "text": "weather today?"})
    (first,) = exporter.get_finished_spans()
    snap.record_span(first)
    store.save(snap)

    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, where],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )
    assert out.returncode == 0, out.stderr
    second = json.loads(out.stdout)

    first_trace = format(first.context.trace_id, "032x")
    first_span = format(first.context.span_id, "016x")
    assert second["attributes"][semconv.SESSION_ID] == "chat-1"
    assert second["attributes"][semconv.PREVIOUS_RUN_ID] == "run-1"
    assert second["attributes"][semconv.GEN_AI_AGENT_NAME] == "planner"
    assert second["links"] == [[first_trace, first_span, {semconv.RUN_ID: "run-1"}]]
    assert second["span_id"] != first_span

    # the store now points at the second run, with both turns in memory and the log
    restored = store.load("chat-1")
    assert restored.version == 2 and restored.memory == {"turns": 2}
    assert [e["text"] for e in restored.events] == ["weather today?", "and tomorrow?"]
    assert restored.tape.run_id == "run-2"
    assert restored.tape.traceparent.startswith(f"00-{second['trace_id']}-{second['span_id']}-")
