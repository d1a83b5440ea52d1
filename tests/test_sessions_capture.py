"""Restoring a session continues its tape through the capture API: a run recorded with
``tape.run(...)``, the session saved, a new process loads it and its next run keeps the session id,
names the previous run (agenttape.previous_run.id) and links to its span (spans from the real SDK pipeline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agenttape
from otel_agenttape import semconv
from otel_agenttape.sessions import FileSessionStore, SessionSnapshot


CHILD = textwrap.dedent(
    """
    import json, sys
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import otel_agenttape
    from otel_agenttape import semconv
    from otel_agenttape.sessions import FileSessionStore, SqlSessionStore

    kind, where, table = sys.argv[1], sys.argv[2], sys.argv[3]
    store = FileSessionStore(where) if kind == "file" else SqlSessionStore(where, table=table)
    snap = store.load("chat-1")
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, service_name="agent-b")
    with tape.run(**snap.tape_context().run_kwargs(), input="and tomorrow?") as run:
        snap.memory["turns"] += 1
        snap.append_event({"role": "user", "content": "and tomorrow?"})
        run.set_output("rain")
    tape.force_flush()
    (span,) = [s for s in exporter.get_finished_spans() if s.attributes.get(semconv.RUN_ID) == run.run_id]
    snap.record_span(span)
    store.save(snap)
    tape.shutdown()
    print(json.dumps({
        "run_id": run.run_id,
        "trace_id": format(span.context.trace_id, "032x"),
        "span_id": format(span.context.span_id, "016x"),
        "attributes": {k: v for k, v in span.attributes.items() if isinstance(v, (str, int))},
        "links": [[format(l.context.trace_id, "032x"), format(l.context.span_id, "016x")] for l in span.links],
    }))
    """
)


def _record_first_run(snap: SessionSnapshot):
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, service_name="agent-a")
    with tape.run(**snap.tape_context().run_kwargs(), input="weather today?") as run:
        snap.memory["turns"] += 1
        snap.append_event({"role": "user", "content": "weather today?"})
        run.set_output("sun")
    tape.force_flush()
    (span,) = [s for s in exporter.get_finished_spans() if s.attributes.get(semconv.RUN_ID) == run.run_id]
    tape.shutdown()
    return run, span


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_restored_session_continues_its_tape_with_capture(tmp_path, kind) -> None:
    table = f"sessions_capture_{uuid.uuid4().hex[:12]}"
    if kind == "file":
        where = str(tmp_path / "sessions")
        store = FileSessionStore(where)
        table_cleanup = None
    else:
        from otel_agenttape.sessions import SqlSessionStore

        if kind == "sqlite":
            where = f"sqlite:///{tmp_path / 's.db'}"
        else:
            where = os.environ.get("AGENTTAPE_TEST_POSTGRES_URL")
            if not where:
                pytest.skip("AGENTTAPE_TEST_POSTGRES_URL is not set: run `export AGENTTAPE_TEST_POSTGRES_URL=$(bash .ci/postgres.sh)`")
        store = SqlSessionStore(where, table=table)
        table_cleanup = store

    try:
        snap = SessionSnapshot(session_id="chat-1", agent="planner", memory={"turns": 0})
        first_run, first_span = _record_first_run(snap)
        snap.record_span(first_span)
        assert snap.tape.run_id == first_run.run_id
        if first_span.attributes.get(semconv.CHAIN_HASH) is not None:  # sealing on: chain head kept
            assert snap.tape.chain_hash == first_span.attributes[semconv.CHAIN_HASH]
        store.save(snap)

        out = subprocess.run([sys.executable, "-c", CHILD, kind, where, table], capture_output=True, text=True,
                             timeout=120, env={**os.environ})
        assert out.returncode == 0, out.stderr
        second = json.loads(out.stdout)

        attrs = second["attributes"]
        assert attrs[semconv.SESSION_ID] == "chat-1"
        assert attrs[semconv.GEN_AI_AGENT_NAME] == "planner"
        assert attrs[semconv.PREVIOUS_RUN_ID] == first_run.run_id
        assert second["run_id"] != first_run.run_id
        assert second["links"] == [[format(first_span.context.trace_id, "032x"),
                                    format(first_span.context.span_id, "016x")]]

        restored = store.load("chat-1")
        assert restored.version == 2 and restored.memory == {"turns": 2}
        assert [e["content"] for e in restored.events] == ["weather today?", "and tomorrow?"]
        assert restored.tape_context().previous_run_id == second["run_id"]
        assert restored.tape.traceparent.startswith(f"00-{second['trace_id']}-{second['span_id']}-")
    finally:
        if table_cleanup is not None:
            import sqlalchemy as sa

            with table_cleanup.engine.begin() as conn:
                conn.execute(sa.text(f'DROP TABLE IF EXISTS "{table}"'))
            table_cleanup.close()


def test_a_later_turn_follows_the_previous_run_and_is_not_its_child():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_agenttape
    from otel_agenttape.sessions import SessionSnapshot

    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal=False)
    snap = SessionSnapshot("turns", agent="support")
    with tape.run(**snap.tape_context().run_kwargs(), run_id="t1") as first:
        pass
    snap.record_span(first.span)
    with tape.run(**snap.tape_context().run_kwargs(), run_id="t2") as second:
        pass
    tape.shutdown()
    assert second.previous_run_id == "t1" and second.parent_run_id is None
    spans = {s.attributes[semconv.RUN_ID]: s for s in exporter.get_finished_spans()}
    later = spans["t2"]
    assert later.attributes[semconv.PREVIOUS_RUN_ID] == "t1"
    assert semconv.PARENT_RUN_ID not in later.attributes
    assert later.parent is None and later.context.trace_id != spans["t1"].context.trace_id
    assert [link.context.span_id for link in later.links] == [spans["t1"].context.span_id]


def test_session_turns_through_the_receiver_rebuild_as_followers_not_children(tmp_path):
    from otel_agenttape.receiver.server import TapeServer
    from otel_agenttape.sessions import FileSessionStore, SessionSnapshot
    from otel_agenttape.tape import reconstruct, reconstruct_tree

    server = TapeServer(str(tmp_path / "tape.duckdb"), http_port=0, grpc_port=0)
    server.start()
    try:
        store = FileSessionStore(tmp_path / "sessions")
        tape = otel_agenttape.setup(endpoint=f"http://127.0.0.1:{server.http_port}", protocol="http/protobuf")
        snap = SessionSnapshot("chat-9", agent="support")
        with tape.run(**snap.tape_context().run_kwargs(), run_id="turn-1", input="hi") as run:
            run.set_output("hello")
        snap.record_span(run.span)
        store.save(snap)
        restored = store.load("chat-9")
        with tape.run(**restored.tape_context().run_kwargs(), run_id="turn-2", input="again") as run:
            run.set_output("welcome back")
        tape.shutdown()
        assert server.wait_idle(30)
        reader = server.store.reader()
        second = reconstruct(reader, "turn-2")
        first_tree = reconstruct_tree(reader, "turn-1")
    finally:
        server.stop()
    assert second.previous_run_id == "turn-1" and second.parent_run_id is None
    assert second.session_id == "chat-9" and second.to_json()["previous_run_id"] == "turn-1"
    assert first_tree.run_count == 1  # a later turn is not nested under the first
