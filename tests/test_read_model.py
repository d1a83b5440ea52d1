"""The read model: the ``runs`` view and the rebuild agree on every run of every source; pages, filters
and cursors; every kind of source ``otel_agenttape.open`` takes; a run's spans round-trip as OTLP."""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

import otel_agenttape
from otel_agenttape.demo import run_demo
from otel_agenttape.store import samples
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.read import RunSummary

T = 1_767_225_600_000_000_000


def _tracer(scope: str = "handmade"):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "handmade"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer(scope), exporter


def _chat(tracer, model: str, tokens: int, error: bool = False, **attrs):
    with tracer.start_as_current_span(f"chat {model}", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": model, "gen_ai.usage.input_tokens": tokens,
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}]),
            **attrs}) as span:
        if error:
            span.set_status(Status(StatusCode.ERROR, "boom"))


def _foreign_store() -> Store:
    """Nested runs of several conventions in one store."""
    tracer, exporter = _tracer()
    # OpenInference: a root CHAIN (LangGraph-like) with a nested AGENT and an LLM in each
    with tracer.start_as_current_span("LangGraph", attributes={"openinference.span.kind": "CHAIN",
                                                               "session.id": "oi-sess"}):
        with tracer.start_as_current_span("node", attributes={"openinference.span.kind": "CHAIN"}):
            with tracer.start_as_current_span("llm", attributes={
                    "openinference.span.kind": "LLM", "llm.model_name": "m-oi", "llm.token_count.prompt": 3}):
                pass
        with tracer.start_as_current_span("researcher", attributes={
                "openinference.span.kind": "AGENT", "agent.name": "researcher"}):
            with tracer.start_as_current_span("search", attributes={"openinference.span.kind": "TOOL",
                                                                    "tool.name": "search"}):
                pass
    # OpenLLMetry: a workflow with an agent child; the agent's tool fails
    with tracer.start_as_current_span("trip.workflow", attributes={
            "traceloop.span.kind": "workflow", "traceloop.workflow.name": "trip", "traceloop.entity.name": "trip",
            "traceloop.association.properties.session_id": "tl-sess"}):
        with tracer.start_as_current_span("booker.agent", attributes={
                "traceloop.span.kind": "agent", "traceloop.entity.name": "booker"}):
            with tracer.start_as_current_span("book.tool", attributes={
                    "traceloop.span.kind": "tool", "traceloop.entity.name": "book"}) as tool:
                tool.set_status(Status(StatusCode.ERROR, "sold out"))
    # OTel GenAI: two sibling invoke_agent spans under a plain HTTP root, and a create_agent span
    with tracer.start_as_current_span("POST /chat"):
        for name in ("alpha", "beta"):
            with tracer.start_as_current_span(f"invoke_agent {name}", attributes={
                    "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name,
                    "gen_ai.conversation.id": "conv-1"}):
                _chat(tracer, "m-genai", 5, error=name == "beta")
    with tracer.start_as_current_span("create_agent maker", attributes={
            "gen_ai.operation.name": "create_agent", "gen_ai.agent.name": "maker"}):
        pass
    # a bare trace: one model call, no agent span
    with tracer.start_as_current_span("script"):
        _chat(tracer, "m-bare", 7)
    store = Store(None)
    store.write_traces([encode_spans(exporter.get_finished_spans())])
    return store


def _scoped_store() -> Store:
    """Spans from framework instrumentations, told apart by their scope."""
    store = Store(None)
    for scope, attrs in (("openinference.instrumentation.openai_agents", {"openinference.span.kind": "AGENT"}),
                         ("openinference.instrumentation.langchain", {"openinference.span.kind": "CHAIN",
                                                                       "metadata": '{"langgraph_step": 1}'}),
                         ("opentelemetry.instrumentation.langchain", {"traceloop.span.kind": "workflow"})):
        tracer, exporter = _tracer(scope)
        with tracer.start_as_current_span(scope.split(".")[-1], attributes=attrs):
            _chat(tracer, "m", 1)
        store.write_traces([encode_spans(exporter.get_finished_spans())])
    return store


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("demo") / "demo.duckdb")
    run_demo(db)
    return db


def _agree(tapes) -> list[RunSummary]:
    """Every listed run opens, and the rebuild says the same as the list."""
    listed = tapes.runs(limit=1000).runs
    for row in listed:
        rebuilt = RunSummary.from_run(tapes.rebuild(row.ref))
        for field in ("ref", "agent", "status", "source", "session_id", "model_calls", "tool_calls",
                      "input_tokens", "errors", "models", "tools", "incomplete"):
            assert getattr(rebuilt, field) == getattr(row, field), (row.ref, field)
        assert (rebuilt.start_ns, rebuilt.end_ns) == (row.start_ns, row.end_ns), row.ref
    return listed


def test_list_and_rebuild_agree_on_every_source(demo_db):
    for source in (demo_db, _foreign_store(), _scoped_store(), Store(None)):
        with otel_agenttape.open(source) as tapes:
            _agree(tapes)


def test_foreign_runs_nest_and_name_their_sessions():
    with otel_agenttape.open(_foreign_store()) as tapes:
        runs = {r.agent: r for r in tapes.runs(limit=100).runs}
        assert set(runs) == {"LangGraph", "researcher", "trip", "booker", "alpha", "beta", "maker",
                             "handmade"}
        assert runs["researcher"].parent_ref == runs["LangGraph"].ref
        assert runs["booker"].parent_ref == runs["trip"].ref
        assert (runs["LangGraph"].session_id, runs["trip"].session_id) == ("oi-sess", "tl-sess")
        assert (runs["alpha"].session_id, runs["alpha"].parent_ref) == ("conv-1", None)  # siblings, not merged
        assert (runs["beta"].status, runs["beta"].errors, runs["alpha"].errors) == ("completed", 1, 0)
        assert (runs["booker"].errors, runs["booker"].tools) == (1, ["book"])
        assert runs["LangGraph"].model_calls == 1 and runs["researcher"].tools == ["search"]
        bare = runs["handmade"]  # the bare trace is named by its trace and its service
        assert bare.run_id == bare.trace_id and bare.models == ["m-bare"]
        assert {r.source for r in runs.values()} == {"openinference", "openllmetry", "otel-genai"}
        tree = tapes.tree(runs["trip"].ref)
        assert [c["agent"] for c in tree["children"]] == ["booker"]
        assert [r.agent for r in tapes.session("conv-1")] == ["alpha", "beta"]
        # the two sibling agents share one trace: its id names the first
        assert tapes.run(runs["alpha"].trace_id).ref == runs["alpha"].ref


def test_framework_sources_by_scope():
    with otel_agenttape.open(_scoped_store()) as tapes:
        assert sorted(r.source for r in tapes.runs().runs) == ["langchain", "langgraph", "openai-agents"]
        assert [r.source for r in tapes.runs(source="langgraph").runs] == ["langgraph"]


def test_filters_pages_and_cursor(demo_db, tmp_path):
    with otel_agenttape.open(demo_db) as tapes:
        everything = tapes.runs().runs
        assert [r.start_ns for r in everything] == sorted((r.start_ns for r in everything), reverse=True)
        seen, cursor = [], None
        while True:
            page = tapes.runs(limit=1, cursor=cursor)
            assert page.total == 3
            seen += [r.ref for r in page.runs]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == [r.ref for r in everything]
        root = next(r for r in everything if r.parent_ref is None)
        assert {r.agent for r in tapes.runs(parent=root.ref).runs} == {"critic", "researcher"}
        assert [r.agent for r in tapes.runs(tool="web_search").runs] == ["researcher"]
        assert tapes.runs(model="demo-model-1").total == 3 and tapes.runs(model="nope").total == 0
        assert tapes.runs(status="error").total == 0 and tapes.runs(source="agenttape").total == 3
        assert tapes.runs(until=root.start_ns).total == 0 and tapes.runs(since=root.start_ns).total == 3
        assert tapes.runs(text="OpenTelemetry").total >= 1 and tapes.runs(text="no such words here").total == 0
        assert tapes.runs(since="2000-01-01").total == 3
        with pytest.raises(ValueError, match="limit"):
            tapes.runs(limit=0)
        with pytest.raises(ValueError, match="cursor"):
            tapes.runs(cursor="not-a-cursor")


def test_a_cursor_is_stable_while_newer_runs_arrive():
    store = Store(None)
    store.write_traces(samples.genai_requests(n_runs=4, start_ns=T))
    with otel_agenttape.open(store) as tapes:
        first = tapes.runs(limit=2)
        store.write_traces(samples.genai_requests(n_runs=3, start_ns=T + 10**12, seed=9))
        rest = tapes.runs(limit=10, cursor=first.next_cursor)
        assert [r.ref for r in first.runs + rest.runs] == [
            r.ref for r in tapes.runs(limit=10, until=T + 10**12).runs]
        assert rest.total == 7 and len(rest.runs) == 2
    store.close()


def test_every_kind_of_source_opens(demo_db, tmp_path):
    from otel_agenttape.store.parquet import export_parquet
    from otel_agenttape.store.reader import open_reader

    with otel_agenttape.open(demo_db) as tapes:
        refs = sorted(r.ref for r in tapes.runs().runs)
        root = next(r for r in tapes.runs().runs if r.parent_ref is None)
        otlp = tapes.spans_otlp(root.ref)
    lake = tmp_path / "lake"
    with open_reader(demo_db) as reader:
        export_parquet(reader, str(lake))
    (tmp_path / "root.json").write_text(json.dumps(otlp))
    with otel_agenttape.open(str(lake)) as tapes:
        assert sorted(r.ref for r in tapes.runs().runs) == refs
        assert tapes.replay(root.ref, tree=True)["children"]
    with otel_agenttape.open([str(tmp_path / "root.json")]) as tapes:
        (only,) = tapes.runs().runs
        assert (only.ref, only.model_calls, only.tape_id) == (root.ref, root.model_calls, root.tape_id)
    with otel_agenttape.open(str(tmp_path / "root.json")) as tapes:
        assert tapes.run(root.ref).agent == "coordinator"


def test_spans_otlp_round_trips_through_ingest(demo_db, tmp_path, capsys):
    from otel_agenttape.cli import main

    with otel_agenttape.open(demo_db) as tapes:
        researcher = tapes.runs(agent="researcher").runs[0]
        before = tapes.replay(researcher.ref)
        (tmp_path / "r.json").write_text(json.dumps(tapes.spans_otlp(researcher.ref)))
    copy = str(tmp_path / "copy.duckdb")
    assert main(["ingest", str(tmp_path / "r.json"), "--db", copy]) == 0
    with otel_agenttape.open(copy) as tapes:
        after = tapes.replay(researcher.ref)
        assert {k: v for k, v in after.items() if k != "parent_run_id"} == {
            k: v for k, v in before.items() if k != "parent_run_id"}
        assert tapes.steps(researcher.ref)[-1]["kind"] == "terminal"
