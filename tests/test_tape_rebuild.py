"""Runs and trees rebuilt end to end: agent (capture API) -> OTLP/HTTP -> receiver -> DuckDB / Parquet -> tape."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_agenttape.store.parquet import export_parquet
from otel_agenttape.store.reader import open_reader
from otel_agenttape.tape import (
    RunNotFound,
    TruncatedPayloadError,
    reconstruct,
    reconstruct_tree,
    replay_model_mock,
)
from tape_agents import ScriptedModel, ScriptedTools, flush, recorder, start_server, weather_agent

HERE = Path(__file__).parent


@pytest.fixture
def served(tmp_path):
    server = start_server(str(tmp_path / "tape.duckdb"))
    tape = recorder(server)
    yield server, tape, tmp_path
    tape.shutdown()
    server.stop()


def test_run_rebuilt_from_duckdb(served):
    server, tape, _ = served
    out = weather_agent(tape, ScriptedModel(), ScriptedTools(), "Weather in Paris?", run_id="run-paris",
                        session_id="sess-1")
    flush(tape, server)
    run = reconstruct(server.store.reader(), "run-paris")
    # while `serve` holds the file, a reader goes through the server's query endpoint: same run
    with open_reader(server.db) as through_server:
        assert type(through_server).__name__ == "HttpReader"
        assert reconstruct(through_server, "run-paris").to_json() == run.to_json()
    assert out == "In Paris it is 57F."
    assert run.status == "completed" and run.agent == "weather" and run.session_id == "sess-1"
    assert [(m.role, m.content()) for m in run.input] == [
        ("system", "You are a terse travel assistant."), ("user", "Weather in Paris?")]
    assert run.output == out  # the run span's own output
    assert [(t.name, t.arguments, t.result, t.call_id) for t in run.tools] == [
        ("get_weather", {"city": "Paris"}, {"city": "Paris", "temp": 57}, "call_1")]
    assert (run.usage.input_tokens, run.usage.output_tokens) == (42, 11)
    assert run.models == ["fake-1"]
    kinds = [s.kind for s in run.steps]
    assert kinds == ["input", "model-start", "text", "text", "tool-call", "model-end", "tool-start",
                     "tool-result", "model-start", "text", "text", "text", "text", "text", "model-end", "terminal"]
    assert "".join(s.payload["text"] for s in run.steps[9:14]) == out
    assert [s.index for s in run.steps] == list(range(len(run.steps)))
    # the model nodes keep their streamed deltas and the raw payload
    first, second = run.model_nodes
    assert first.deltas == ["Check", "ing."] and second.output_text == out
    assert replay_model_mock(first).raw["choices"][0]["finish_reason"] == "tool_calls"
    assert [m.role for m in second.prompt] == ["system", "user", "assistant", "tool"]


def test_status_error_cancelled_truncated(served):
    server, tape, _ = served
    with pytest.raises(RuntimeError):
        weather_agent(tape, ScriptedModel(), ScriptedTools(fail=True), "Weather in Oslo?", run_id="run-err")

    async def cancelled() -> None:
        with tape.run("waiter", run_id="run-cancel", input="wait"):
            await asyncio.sleep(10)

    async def cancel_it() -> None:
        task = asyncio.create_task(cancelled())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    def crash() -> None:  # a run whose process dies: entered, never exited
        crashed = tape.run("crasher", run_id="run-crash", input="go").__enter__()
        with crashed.model_call(model="m", messages=[{"role": "user", "content": "go"}]) as call:
            call.finish(text="half")

    contextvars.copy_context().run(crash)  # keep the never-ended run out of the next tests' context
    with tape.run("capped", run_id="run-trunc", input="long") as run:
        run.status = "truncated"
        run.set_output("partial")
    flush(tape, server)
    reader = server.store.reader()
    err = reconstruct(reader, "run-err")
    assert err.status == "error" and "RuntimeError" in (err.status_message or "")
    assert err.tools[0].error and "weather service down" in err.tools[0].error
    assert [s.kind for s in err.steps][-1] == "terminal" and err.steps[-1].payload["status"] == "error"
    assert reconstruct(reader, "run-cancel").status == "cancelled"
    assert reconstruct(reader, "run-trunc").status == "truncated"
    crash = reconstruct(reader, "run-crash")
    assert crash.status == "incomplete" and crash.output == "half" and len(crash.model_nodes) == 1


def test_cut_payload_is_flagged_and_refuses_mock_replay(tmp_path):
    server = start_server(str(tmp_path / "t.duckdb"))
    tape = recorder(server, max_payload_chars=40)
    try:
        weather_agent(tape, ScriptedModel(answer_prefix="Well, well, well, well, in"), ScriptedTools(),
                      "Weather in Rome?", run_id="run-cut")
        flush(tape, server)
        run = reconstruct(server.store.reader(), "run-cut")
    finally:
        tape.shutdown()
        server.stop()
    assert run.truncated, "cut payloads must be visible on the run"
    cut = [n for n in run.model_nodes if n.truncated]
    assert cut
    with pytest.raises(TruncatedPayloadError):
        replay_model_mock(cut[-1])


def test_parquet_lake_and_duckdb_file_rebuild_the_same(served):
    server, tape, tmp_path = served
    weather_agent(tape, ScriptedModel(), ScriptedTools(), "Weather in Lima?", run_id="run-lima")
    flush(tape, server)
    tape.shutdown()
    server.stop()
    with open_reader(str(tmp_path / "tape.duckdb")) as db_reader:
        from_db = reconstruct(db_reader, "run-lima").to_json()
        export_parquet(db_reader, str(tmp_path / "lake"))
    with open_reader(str(tmp_path / "lake")) as lake_reader:
        from_lake = reconstruct(lake_reader, "run-lima").to_json()
    assert from_db == from_lake
    assert from_db["output"] == "In Lima it is 66F."
    with open_reader(str(tmp_path / "tape.duckdb")) as db_reader, pytest.raises(RunNotFound):
        reconstruct(db_reader, "no-such-run")


def test_coordinator_tree_with_a_child_in_another_process(served):
    server, tape, _ = served
    with tape.run("coordinator", run_id="coord", input="Plan a trip") as coord:
        for i, city in enumerate(["Paris", "Oslo"]):
            weather_agent(tape, ScriptedModel(), ScriptedTools(), f"Weather in {city}?", parent=coord,
                          agent=f"specialist-{i}", run_id=f"child-{i}")
        carrier = coord.inject({})
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run(
            [sys.executable, str(HERE / "tape_child.py"), server.url, json.dumps(carrier), "child-remote"],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        coord.set_output("Trip planned")
    flush(tape, server)
    tree = reconstruct_tree(server.store.reader(), "coord")
    assert tree.run_count == 4
    assert tree.root.run_id == "coord" and tree.root.output == "Trip planned"
    assert [c.run_id for c in tree.children] == ["child-0", "child-1", "child-remote"]
    remote = tree.children[2]
    assert remote.trace_id != tree.root.trace_id, "the remote child records its own trace"
    assert remote.parent_run_id == "coord"
    assert remote.output == "In Lima it is 66F."
    assert [c.agent for c in tree.children] == ["specialist-0", "specialist-1", "remote-specialist"]
    starts = [c.start_ns for c in tree.children]
    assert starts == sorted(starts)
    # the coordinator's own run keeps only its own nodes
    assert reconstruct(server.store.reader(), "coord").nodes == []
    # a tree rooted at a child holds just that child
    assert reconstruct_tree(server.store.reader(), "child-0").run_count == 1
    # the same tree from a Parquet lake of the store, across both traces
    _, _, tmp_path = served
    export_parquet(server.store.reader(), str(tmp_path / "lake"))
    lake = open_reader(str(tmp_path / "lake"))
    try:
        from_lake = reconstruct_tree(lake, "coord")
    finally:
        lake.close()
    assert from_lake.root.to_json(children=True) == tree.root.to_json(children=True)


def test_a_child_that_died_in_another_process_stays_in_the_tree(served):
    server, tape, _ = served
    with tape.run("coordinator", run_id="coord-c", session_id="sess-c", input="Plan") as coord:
        carrier = coord.inject({})
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run(
            [sys.executable, str(HERE / "tape_child.py"), server.url, json.dumps(carrier), "child-dead", "crash"],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 1, proc.stderr
        coord.set_output("done without it")
    flush(tape, server)
    tree = reconstruct_tree(server.store.reader(), "coord-c")
    (dead,) = tree.children
    assert dead.run_id == "child-dead" and dead.status == "incomplete"
    assert dead.parent_run_id == "coord-c" and dead.session_id == "sess-c"
    assert [n.tool_name for n in dead.nodes] == ["lookup"]
