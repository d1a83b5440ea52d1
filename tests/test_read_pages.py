"""A page of runs is read from the runs' keys first and only its runs are summarised: it must list what
the ``runs`` view lists — same rows, same fields, same order and total — for every filter, on a store
that mixes agenttape runs (complete, incomplete, a run id reused in two traces) with other sources'."""

from __future__ import annotations

import gc

import orjson
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

import otel_agenttape
from otel_agenttape.demo import run_demo
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.load import _rows
from otel_agenttape.tape.read import RunSummary
from otel_agenttape.tape.read.cost import price_summaries
from otel_agenttape.tape.read.filters import Filters
from otel_agenttape.tape.read.scores import score_summaries
from otel_agenttape.tape.read.run_rows import RUN_COLUMNS


def _spans(build) -> bytes:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "mixed"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer("handmade"))
    return encode_spans(exporter.get_finished_spans())


def _others(tracer) -> None:
    with tracer.start_as_current_span("invoke_agent planner", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner",
            "gen_ai.conversation.id": "conv-9"}):
        with tracer.start_as_current_span("chat", attributes={
                "gen_ai.operation.name": "chat", "gen_ai.request.model": "m-genai",
                "gen_ai.usage.input_tokens": 5}) as span:
            span.set_status(Status(StatusCode.ERROR, "boom"))
        # an agenttape node inside another instrumentation's trace: its own run, in a mixed trace
        with tracer.start_as_current_span("chat ours", attributes={
                "agenttape.run.id": "run-mixed", "agenttape.node.type": "model", "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "m-ours", "gen_ai.agent.name": "inner"}):
            pass
    with tracer.start_as_current_span("chain", attributes={"openinference.span.kind": "CHAIN",
                                                           "session.id": "oi-9"}):
        with tracer.start_as_current_span("tool", attributes={"openinference.span.kind": "TOOL",
                                                              "tool.name": "grep"}):
            pass
    with tracer.start_as_current_span("bare", attributes={"gen_ai.operation.name": "chat",
                                                          "gen_ai.request.model": "m-bare"}):
        pass
    for _ in range(2):  # a run id reused in two traces, with no run span: two incomplete runs
        with tracer.start_as_current_span("lookup", attributes={
                "agenttape.run.id": "run-again", "agenttape.node.type": "tool", "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "lookup", "gen_ai.agent.name": "again"}):
            pass


def _scored(tracer) -> None:
    """Another instrumentation's run scored by an evaluation event on its chat span."""
    with tracer.start_as_current_span("invoke_agent judged", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "judged"}):
        with tracer.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat"}) as span:
            span.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "helpfulness",
                                                        "gen_ai.evaluation.score.value": 0.6,
                                                        "gen_ai.evaluation.score.label": "ok"})


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("mixed") / "mixed.duckdb")
    run_demo(db)
    store = Store(db)
    store.write_traces([_spans(_others), _spans(_scored)])
    # the demo's runs scored after the fact, in score tapes of their own (as `agenttape score` does)
    refs = sorted(r.ref for r in otel_agenttape.open(store).runs(source="agenttape", limit=100).runs)
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal=False)
    for i, ref in enumerate(refs[:4]):
        tape.score(ref, "helpfulness", 0.2 * (i + 1), label="good" if i % 2 else "bad")
    tape.score(refs[0], "helpfulness", 0.95)  # a later score of the same name overrides
    tape.shutdown()
    store.write_traces([encode_spans(exporter.get_finished_spans())])
    store.close()
    return db


def _view(tapes, filters: Filters, oldest_first: bool = False) -> list[dict]:
    where, params = filters.where()
    order = "start_time_unix_nano, ref" if oldest_first else "start_time_unix_nano DESC, ref DESC"
    rows = [RunSummary.from_row(r)
            for r in _rows(tapes.reader, f"SELECT {RUN_COLUMNS} FROM runs WHERE {where} ORDER BY {order}", params)]
    price_summaries(tapes.reader, rows, tapes.prices)  # a page's runs carry their cost: the view's rows too
    score_summaries(tapes.reader, rows)  # and their scores
    return [r.to_dict() for r in rows]


def _paged(tapes, **kwargs) -> tuple[list[dict], set[int]]:
    seen, totals, cursor = [], set(), None
    while True:
        page = tapes.runs(limit=2, cursor=cursor, **kwargs)
        seen += [r.to_dict() for r in page.runs]
        totals.add(page.total)
        cursor = page.next_cursor
        if cursor is None:
            return seen, totals


def test_pages_list_what_the_view_lists_for_every_filter(mixed):
    with otel_agenttape.open(mixed) as tapes:
        everything = _view(tapes, Filters())
        assert {r["source"] for r in everything} >= {"agenttape", "otel-genai", "openinference"}
        assert sum(r["ref"].startswith("run-again@") for r in everything) == 2
        asks = [{}]
        for name, field in (("agent", "agent"), ("status", "status"), ("source", "source"),
                            ("session", "session_id"), ("service", "service")):
            asks += [{name: v} for v in sorted({r[field] for r in everything if r[field] is not None})]
        asks += [{"model": m} for m in sorted({m for r in everything for m in r["models"]})]
        asks += [{"tool": t} for t in sorted({t for r in everything for t in r["tools"]})]
        asks += [{"text": "boom"}, {"text": "lookup"}, {"model": "nope"},
                 {"since": everything[len(everything) // 2]["start_ns"]},
                 {"until": everything[len(everything) // 2]["start_ns"], "source": "agenttape"}]
        scored = [r for r in everything if r["scores"]]
        assert len(scored) == 5 and {r["source"] for r in scored} == {"agenttape", "otel-genai"}
        asks += [{"score": ("helpfulness>=0.6",)}, {"score": ("helpfulness<0.5",), "source": "agenttape"},
                 {"label": ("helpfulness=good",)}, {"score": ("helpfulness>0.3",), "label": ("helpfulness=bad",)}]
        for ask in asks:
            expected = _view(tapes, Filters(**ask))
            if "score" in ask or "label" in ask:
                assert expected, ask
            listed, totals = _paged(tapes, **ask)
            assert listed == expected, ask
            assert totals == {len(expected)}, ask
        for row in everything:
            assert tapes.run(row["ref"]).to_dict() == row, row["ref"]
        for session in {r["session_id"] for r in everything if r["session_id"]}:
            assert [r.to_dict() for r in tapes.session(session)] == _view(
                tapes, Filters(session=session), oldest_first=True), session


@pytest.fixture
def read_limit():
    """Set the read model's memory bound for one test (put back after)."""
    from otel_agenttape import read_memory

    yield read_memory.set_limit
    read_memory.set_limit(read_memory.DEFAULT_LIMIT)


def test_pages_are_the_same_whatever_the_read_model_may_keep(mixed, read_limit):
    """Under the read model's memory bound (``read_memory``, a receiver's --memory-limit share) pages list
    the same runs, fields, scores and totals, whether every run's keys and summaries are kept, only some
    summaries, or nothing at all; what is kept never passes the bound."""
    from otel_agenttape import read_memory

    asks = [{}, {"agent": "again"}, {"source": "agenttape"}, {"score": ("helpfulness>=0.6",)}]
    with otel_agenttape.open(mixed) as tapes:
        expected = {str(a): _view(tapes, Filters(**a)) for a in asks}
        for ask in asks:
            assert _paged(tapes, **ask)[0] == expected[str(ask)], ask
        kept_all = read_memory.held()
        assert kept_all > 0  # the keys, the summaries read and the scores
    summaries = len(expected["{}"])
    gc.collect()  # readers of earlier tests left unclosed: what they keep counts under the same bound
    assert read_memory.held() == 0  # closing the read model let go of what it kept
    for limit in (0, kept_all - (summaries - 3) * read_memory.SUMMARY_BYTES, kept_all // 2):
        read_limit(max(0, limit))
        with otel_agenttape.open(mixed) as tapes:
            for ask in asks:
                listed, totals = _paged(tapes, **ask)
                assert listed == expected[str(ask)], (limit, ask)
                assert totals == {len(listed)}, (limit, ask)
                assert read_memory.held() <= max(0, limit), (limit, ask, read_memory.held())
            if limit == 0:
                assert read_memory.held() == 0


def test_letting_go_of_what_the_read_model_keeps_changes_no_page(mixed):
    """``read_memory.release()`` (a quiet receiver's) drops every kept key, summary and score at once; the
    pages after it are the same, and keep again."""
    from otel_agenttape import read_memory

    asks = [{}, {"agent": "again"}, {"score": ("helpfulness>=0.6",)}]
    with otel_agenttape.open(mixed) as tapes:
        expected = {str(a): _paged(tapes, **a) for a in asks}
        for ask in asks:  # the second pass is answered from what the first one kept
            assert _paged(tapes, **ask) == expected[str(ask)], ask
        kept = read_memory.held()
        assert kept > 0
        assert read_memory.release() == kept
        assert read_memory.held() == 0
        for ask in asks:
            assert _paged(tapes, **ask) == expected[str(ask)], ask
        assert read_memory.held() > 0  # kept again as it read


def test_kept_answers_count_under_the_read_models_bound_and_go_with_a_release(mixed, read_limit):
    """The console's kept steps and trees (``Tapes.memo``) count in ``read_memory.held()``; an answer that
    does not fit is answered and not kept; ``release()`` lets go of them too."""
    from otel_agenttape import read_memory

    with otel_agenttape.open(mixed) as tapes:
        refs = [r["ref"] for r in _view(tapes, Filters())][:4]
        computed = []

        def steps(ref):
            computed.append(ref)
            return tapes.steps(ref)

        read_memory.release()
        before = read_memory.held()
        answers = [tapes.memo(("steps", ref), lambda ref=ref: steps(ref)) for ref in refs]
        kept = read_memory.held() - before
        assert kept >= sum(len(orjson.dumps(a, default=str)) for a in answers)  # counted, at 3 bytes a JSON byte
        assert [tapes.memo(("steps", ref), lambda ref=ref: steps(ref)) for ref in refs] == answers
        assert computed == refs  # the second time from what was kept
        assert read_memory.release() >= kept and read_memory.held() == 0
        read_limit(0)  # nothing fits: answered every time, the same, and nothing kept
        assert [tapes.memo(("steps", ref), lambda ref=ref: steps(ref)) for ref in refs] == answers
        assert [tapes.memo(("steps", ref), lambda ref=ref: steps(ref)) for ref in refs] == answers
        assert computed == refs * 3 and read_memory.held() == 0


def _ours(run_id: str, agent: str, *, parent: str | None = None, node: str | None = None,
          link_to=None, keep=None):
    """An agenttape run span (or node span) in a trace of its own, as the tracer ``build`` gets it."""
    from opentelemetry.trace import Link

    def build(tracer) -> None:
        attrs = {"agenttape.run.id": run_id, "gen_ai.agent.name": agent}
        if node is None:
            attrs.update({"agenttape.node.type": "run", "gen_ai.operation.name": "invoke_agent"})
        else:
            attrs.update({"agenttape.node.type": "tool", "gen_ai.operation.name": "execute_tool",
                          "gen_ai.tool.name": node})
        if parent:
            attrs["agenttape.parent_run.id"] = parent
        links = [Link(link_to)] if link_to is not None else None
        with tracer.start_as_current_span(f"{run_id} {node or 'run'}", attributes=attrs, links=links) as span:
            if keep is not None:
                keep.append(span.get_span_context())

    return build


@pytest.mark.parametrize("keep", ["everything", "nothing"])
def test_pages_kept_between_writes_follow_the_store(tmp_path, read_limit, keep):
    """Pages of a store being written (the writer's own database, as `agenttape serve` reads it) list what
    the view lists after every write: runs that gain spans, a parent or a linked run arriving after its
    children, and another source's spans arriving last; also when the read model may keep nothing."""
    if keep == "nothing":
        read_limit(0)
    store = Store(str(tmp_path / "live.duckdb"))
    from opentelemetry.trace import SpanContext, TraceFlags

    later = SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=False, trace_flags=TraceFlags(1))

    def check(tapes) -> None:
        expected = _view(tapes, Filters())
        for ask in ({}, {"agent": "child"}, {"status": "completed"}):
            listed, totals = _paged(tapes, **ask)
            assert listed == _view(tapes, Filters(**ask)), ask
            assert totals == {len(listed)}, ask
        return expected

    try:
        tapes = otel_agenttape.open(store)
        store.write_traces([_spans(_ours("run-first", "first"))])
        check(tapes)
        store.write_traces([_spans(_ours("run-child", "child", parent="run-parent")),
                            _spans(_ours("run-linker", "linker", link_to=later))])
        rows = {r["ref"].split("@")[0]: r for r in check(tapes)}
        assert rows["run-child"]["parent_ref"].endswith("@" + rows["run-child"]["trace_id"])
        assert rows["run-linker"]["parent_ref"] is None
        # the parent run arrives in a trace of its own; the linked span is not a run: still no parent
        store.write_traces([_spans(_ours("run-parent", "parent"))])
        rows = {r["ref"].split("@")[0]: r for r in check(tapes)}
        assert rows["run-child"]["parent_ref"] == rows["run-parent"]["ref"]
        # a run gains a node span in its trace
        child_trace = rows["run-child"]["trace_id"]

        def more(tracer) -> None:
            from opentelemetry import trace as api

            ctx = api.set_span_in_context(api.NonRecordingSpan(SpanContext(
                trace_id=int(child_trace, 16), span_id=0x1234, is_remote=True, trace_flags=TraceFlags(1))))
            with tracer.start_as_current_span("run-child lookup", context=ctx, attributes={
                    "agenttape.run.id": "run-child", "agenttape.node.type": "tool",
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}):
                pass

        store.write_traces([_spans(more)])
        rows = {r["ref"].split("@")[0]: r for r in check(tapes)}
        assert rows["run-child"]["tool_calls"] == 1
        # another instrumentation's spans: the kept keys are read again, with its runs
        store.write_traces([_spans(_others)])
        assert any(r["source"] != "agenttape" for r in check(tapes))
        tapes.close()
    finally:
        store.close()


def test_kept_keys_that_grow_past_the_bound_are_let_go(tmp_path, read_limit):
    """Keys kept while they fit are not kept past the bound when runs arrive: the next pages still list
    what the view lists, and what is kept stays under the bound."""
    from otel_agenttape import read_memory

    gc.collect()  # readers of earlier tests left unclosed: what they keep counts under the same bound
    store = Store(str(tmp_path / "grow.duckdb"))
    try:
        store.write_traces([_spans(_ours(f"run-{i}", "first")) for i in range(6)])
        tapes = otel_agenttape.open(store)
        _paged(tapes)
        _paged(tapes)  # the second pass reads every run's keys and keeps them
        from otel_agenttape.tape.read.kept import _KEPT

        read_limit(_KEPT[tapes.reader].keys.nbytes)  # room for the keys kept now, and nothing more
        store.write_traces([_spans(_ours("run-more", "later"))])  # one run more: its keys merged in
        listed, totals = _paged(tapes)
        assert listed == _view(tapes, Filters()) and totals == {7}
        assert read_memory.held() <= read_memory.limit()
        tapes.close()
    finally:
        store.close()
