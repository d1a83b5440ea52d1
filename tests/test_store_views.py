"""The runs, nodes and steps views over stored spans and span events."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from otel_agenttape import semconv as sc
from otel_agenttape.store import samples
from otel_agenttape.store.writer import Store

T = 1_767_225_600_000_000_000


def _run(tracer, run_id="R1", fail_tool=True):
    run = tracer.start_span("invoke_agent coord", start_time=T, attributes={
        sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "coord", sc.RUN_ID: run_id,
        sc.SESSION_ID: "S1", sc.RUN_STATUS: sc.STATUS_ERROR})
    ctx = trace.set_span_in_context(run)
    m = tracer.start_span("chat m1", context=ctx, kind=SpanKind.CLIENT, start_time=T + 10, attributes={
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.GEN_AI_REQUEST_MODEL: "m1", sc.RUN_ID: run_id, sc.SESSION_ID: "S1",
        sc.TURN_ID: "t1", sc.STEP: 1, sc.NODE_TYPE: "model", sc.GEN_AI_INPUT_MESSAGES: '[{"role":"user"}]',
        sc.MODEL_RAW_OUTPUT: '{"raw": true}', sc.GEN_AI_USAGE_INPUT_TOKENS: 10, sc.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
        sc.RECORD_ID: "rec-1"})
    # events out of order in seq: the views order by agenttape.seq
    m.add_event(sc.EVENT_TEXT, {sc.EVENT_SEQ: 3, sc.EVENT_SEGMENT: "world"}, T + 14)
    m.add_event(sc.EVENT_TEXT, {sc.EVENT_SEQ: 2, sc.EVENT_SEGMENT: "hello "}, T + 13)
    m.add_event(sc.EVENT_REASONING, {sc.EVENT_SEQ: 0, sc.EVENT_SEGMENT: "think a"}, T + 11)
    m.add_event(sc.EVENT_REASONING, {sc.EVENT_SEQ: 1, sc.EVENT_SEGMENT: "think b"}, T + 12)
    m.add_event(sc.EVENT_RETRY, {sc.EVENT_SEQ: 4, sc.EVENT_REASON: "429"}, T + 15)
    m.add_event(sc.EVENT_RETRY, {sc.EVENT_SEQ: 5, sc.EVENT_REASON: "429"}, T + 16)
    m.end(end_time=T + 20)
    t1 = tracer.start_span("execute_tool a", context=ctx, start_time=T + 20, attributes={
        sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "a", sc.GEN_AI_TOOL_CALL_ID: "c1",
        sc.GEN_AI_TOOL_CALL_ARGUMENTS: '{"x":1}', sc.GEN_AI_TOOL_CALL_RESULT: '{"ok":1}', sc.RUN_ID: run_id,
        sc.TURN_ID: "t1", sc.STEP: 2, sc.NODE_TYPE: "tool"})
    t2 = tracer.start_span("execute_tool b", context=ctx, start_time=T + 21, attributes={
        sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "b", sc.GEN_AI_TOOL_CALL_ID: "c2",
        sc.GEN_AI_TOOL_CALL_ARGUMENTS: '{"y":2}', sc.RUN_ID: run_id, sc.TURN_ID: "t1", sc.STEP: 2,
        sc.NODE_TYPE: "tool", sc.TOOL_ERROR: "KeyError: y"})
    if fail_tool:
        t2.set_status(Status(StatusCode.ERROR, "KeyError"))
    t1.end(end_time=T + 30)
    t2.end(end_time=T + 31)
    run.set_status(Status(StatusCode.ERROR, "tool failed"))
    run.end(end_time=T + 40)


def _foreign(tracer):
    """GenAI spans from another instrumentation: no agenttape.* attributes at all."""
    run = tracer.start_span("invoke_agent other", start_time=T + 100, attributes={
        sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "other"})
    ctx = trace.set_span_in_context(run)
    m = tracer.start_span("chat x", context=ctx, start_time=T + 101, attributes={
        sc.GEN_AI_OPERATION_NAME: "generate_content", sc.GEN_AI_RESPONSE_MODEL: "g1",
        sc.GEN_AI_OUTPUT_MESSAGES: '[{"role":"assistant"}]'})
    m.end(end_time=T + 102)
    run.end(end_time=T + 103)


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("views") / "v.duckdb")
    store = Store(db)
    store.write_traces(samples.sdk_requests(lambda tr: (_run(tr), _foreign(tr))))
    r = store.reader()
    yield r
    r.close()
    store.close()


def test_runs(reader):
    runs = {r["agent"]: r for r in reader.query("SELECT * FROM runs").to_pylist()}
    r = runs["coord"]
    assert r["run_id"] == "R1" and r["session_id"] == "S1" and r["status"] == "error"
    assert (r["model_nodes"], r["tool_nodes"], r["tool_errors"]) == (1, 2, 1)
    assert (r["input_tokens"], r["output_tokens"]) == (10, 5)
    assert r["start_time_unix_nano"] == T and r["duration_ms"] == pytest.approx(40e-6)
    o = runs["other"]
    assert o["run_id"] == o["span_id"] and o["status"] == "completed" and o["model_nodes"] == 1


def test_nodes(reader):
    nodes = {n["node_id"]: n for n in reader.query("SELECT * FROM nodes").to_pylist()}
    m = nodes["model@R1|t1|1"]
    assert m["record_id"] == "rec-1" and m["node_type"] == "model" and m["model_id"] == "m1"
    assert m["inputs"] == '[{"role":"user"}]' and m["raw_output"] == '{"raw": true}'
    assert m["output_text"] == "hello world" and m["reasoning"] == "think a\nthink b"
    assert m["retry_count"] == 2 and (m["input_tokens"], m["output_tokens"]) == (10, 5)
    assert (m["start_time_unix_nano"], m["end_time_unix_nano"]) == (T + 10, T + 20)
    a, b = nodes["tool@R1|t1|2|c1"], nodes["tool@R1|t1|2|c2"]
    assert a["inputs"] == '{"x":1}' and a["raw_output"] == '{"ok":1}' and a["retry_count"] is None
    assert b["status_code"] == 2 and b["tool_error"] == "KeyError: y" and b["output_text"] is None
    foreign = [n for n in nodes.values() if n["model_id"] == "g1"][0]
    run_span = reader.query("SELECT span_id FROM spans WHERE agent_name = 'other'").column(0)[0].as_py()
    assert foreign["node_type"] == "model" and foreign["run_id"] == run_span
    assert foreign["raw_output"] == '[{"role":"assistant"}]'
    assert foreign["record_id"] == foreign["span_id"]


def test_steps_ordered_tape(reader):
    steps = reader.query("SELECT * FROM steps WHERE run_id = 'R1' ORDER BY step_index").to_pylist()
    assert [s["step_index"] for s in steps] == list(range(len(steps)))
    kinds = [s["kind"] for s in steps]
    assert kinds == ["input", "reasoning", "reasoning", "text", "text", "metadata", "metadata",
                     "tool_call", "tool_call", "tool_result", "tool_result", "terminal"]
    assert [s["content"] for s in steps if s["kind"] == "text"] == ["hello ", "world"]
    results = [s for s in steps if s["kind"] == "tool_result"]
    assert [(r["name"], r["status"]) for r in results] == [("a", "ok"), ("b", "error")]
    assert results[1]["content"] == "KeyError: y"
    assert steps[-1]["status"] == "error" and steps[-1]["content"] == "tool failed"
    assert steps[0]["content"] == '[{"role":"user"}]'


def test_view_columns_are_stable(reader):
    cols = {v: reader.query(f"SELECT * FROM {v} LIMIT 0").column_names for v in ("runs", "nodes", "steps")}
    for needed in ("record_id", "run_id", "session_id", "turn_id", "step", "node_type", "node_id", "model_id",
                   "inputs", "output_text", "raw_output", "start_time_unix_nano", "end_time_unix_nano",
                   "duration_ms", "reasoning", "retry_count", "input_tokens", "output_tokens"):
        assert needed in cols["nodes"]
    for needed in ("run_id", "trace_id", "agent", "session_id", "status", "start_time", "duration_ms",
                   "model_nodes", "tool_nodes", "input_tokens", "output_tokens"):
        assert needed in cols["runs"]


def test_a_run_id_recorded_in_two_traces_counts_each_traces_own_nodes(tmp_path):
    """A run id reused by a second process (its own trace): each `runs` row counts its own nodes."""
    store = Store(str(tmp_path / "twice.duckdb"))
    store.write_traces(samples.sdk_requests(lambda tr: _run(tr, "R2")))
    store.write_traces(samples.sdk_requests(lambda tr: _run(tr, "R2", fail_tool=False)))
    reader = store.reader()
    rows = reader.query("SELECT trace_id, model_nodes, tool_nodes, tool_errors, input_tokens FROM runs "
                        "WHERE run_id = 'R2' ORDER BY tool_errors").to_pylist()
    reader.close()
    store.close()
    assert len({r["trace_id"] for r in rows}) == 2
    assert [(r["model_nodes"], r["tool_nodes"], r["tool_errors"], r["input_tokens"]) for r in rows] == [
        (1, 2, 0, 10), (1, 2, 1, 10)]
