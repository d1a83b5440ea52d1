"""Picking runs by start time and agent: whole runs are picked, never cut to the spans that match."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from otel_agenttape import semconv as sc
from otel_agenttape.store import samples
from otel_agenttape.store.writer import Store
from otel_agenttape.tape import iter_runs
from otel_agenttape.tape.read import Tapes
from otel_agenttape.tape.read.filters import parse_since

T = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
MIN = 60 * 1_000_000_000


def _long_run(tracer, run_id: str, start: int) -> None:
    """A ten-minute run whose run span alone names the agent; nodes early and late."""
    run = tracer.start_span("invoke_agent planner", start_time=start, attributes={
        sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "planner", sc.RUN_ID: run_id})
    ctx = trace.set_span_in_context(run)
    for at in (start + MIN // 60, start + 9 * MIN):
        tracer.start_span("chat m", context=ctx, start_time=at, attributes={
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.RUN_ID: run_id, sc.NODE_TYPE: "model"}).end(end_time=at + 5)
    run.end(end_time=start + 10 * MIN)


@pytest.fixture()
def reader(tmp_path):
    store = Store(str(tmp_path / "sel.duckdb"))
    store.write_traces(samples.sdk_requests(lambda tr: (_long_run(tr, "early", T), _long_run(tr, "late", T + 30 * MIN))))
    r = store.reader()
    yield r
    r.close()
    store.close()


def _listed(reader, **filters):
    return sorted(Tapes(reader, owns=False).runs(**filters).runs, key=lambda r: r.start_ns)


def test_since_picks_runs_that_started_then_and_keeps_their_whole_window(reader):
    assert [r.run_id for r in _listed(reader, since=T)] == ["early", "late"]
    (early, _) = _listed(reader, since=T)
    assert (early.start_ns, early.end_ns) == (T, T + 10 * MIN)  # from the run span's start to its end
    (run,) = iter_runs(reader, [early.ref])
    assert len(run.model_nodes) == 2  # the whole run is rebuilt, the late node too
    # a cutoff in the middle of a run: that run started before it, so it is not picked
    assert [r.run_id for r in _listed(reader, since=T + 5 * MIN)] == ["late"]


def test_agent_filter_keeps_the_spans_that_do_not_name_the_agent(reader):
    (early, late) = _listed(reader, agent="planner")
    assert (early.start_ns, early.end_ns) == (T, T + 10 * MIN) and late.start_ns == T + 30 * MIN
    assert early.model_calls == 2  # its model spans do not name the agent, and still count
    assert _listed(reader, agent="nobody") == []


def test_since_reads_iso_dates_and_nanoseconds_only():
    assert parse_since("2026-01-01") == parse_since("20260101") == T
    assert parse_since("2026-01-01T00:00:00Z") == T and parse_since(str(T)) == T
    for ambiguous in ("1767225600", "1767225600000"):  # seconds, milliseconds: not nanoseconds
        with pytest.raises(ValueError, match="ISO date"):
            parse_since(ambiguous)


def test_a_requested_tool_that_never_ran_is_marked(tmp_path):
    """The question after a crash, "did we pay?": a requested call with no tool span says it never ran."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_agenttape
    from otel_agenttape.tape import reconstruct

    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal=False)
    with tape.run(agent="a", run_id="asked") as run:
        with run.model_call("m", [{"role": "user", "content": "pay and look up"}]) as call:
            call.finish(tool_calls=[{"id": "t1", "name": "lookup", "arguments": {"q": 1}},
                                    {"id": "t2", "name": "pay", "arguments": {"amount": 5}}])
        with run.tool_call("lookup", {"q": 1}, call_id="t1") as tool:
            tool.result(None)  # ran, and returned nothing
    tape.shutdown()
    store = Store(str(tmp_path / "asked.duckdb"))
    store.write_traces([encode_spans(exporter.get_finished_spans())])
    tools = reconstruct(store.reader(), "asked").to_json()["tools"]
    store.close()
    assert [(t["name"], t["result"], t.get("ran", True)) for t in tools] == [("lookup", None, True), ("pay", None, False)]
