"""Cost at read time: OpenAI and Anthropic usage with cached tokens priced as genai-prices' table says
(expected dollars computed by hand in cost_support), an unknown model unknown and counted, overrides."""

from __future__ import annotations

import json
import socket

import pytest

import otel_agenttape
from cost_support import ANTHROPIC_USD, LOCAL_MODEL, OPENAI_USD, record
from otel_agenttape.cli import main
from otel_agenttape.pricing import Prices, PricesFileError


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return record(tmp_path_factory.mktemp("cost"))


def test_prices_by_hand_and_never_the_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("pricing opened a socket")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    from genai_prices import data_snapshot
    p = Prices()
    assert p.call_usd("openai", "gpt-4o", 1000, 500, 200, None) == pytest.approx(OPENAI_USD)
    assert p.call_usd("anthropic", "claude-3-5-sonnet-20241022", 1000, 500, 200, 100) == pytest.approx(ANTHROPIC_USD)
    # a snapshot set by genai-prices' auto-update is never used
    monkeypatch.setattr(data_snapshot, "_custom_snapshot", data_snapshot.DataSnapshot(providers=[], from_auto_update=True))
    assert Prices().call_usd("openai", "gpt-4o", 1000, 500, 200, None) == pytest.approx(OPENAI_USD)
    assert p.call_usd("vllm", LOCAL_MODEL, 10, 5) is None
    assert p.call_usd("openai", "gpt-4o", None, None) is None


def test_runs_tree_session_and_unknown(db):
    with otel_agenttape.open(db) as t:
        runs = {r.agent: r for r in t.runs().runs}
        assert runs["planner"].cost_usd == pytest.approx(OPENAI_USD + ANTHROPIC_USD)
        assert runs["helper"].cost_usd == pytest.approx(OPENAI_USD) and runs["helper"].unpriced_calls == 1
        assert runs["second"].cost_usd is None and runs["second"].unpriced_calls == 1
        tree = t.cost("run-planner", tree=True)
        assert tree["usd"] == pytest.approx(2 * OPENAI_USD + ANTHROPIC_USD) and tree["unpriced_calls"] == 1
        doc = t.replay("run-helper")
        assert [c["usd"] for c in doc["cost"]["calls"]] == [None, pytest.approx(OPENAI_USD)]
        assert t.cost(session="s1")["unpriced_calls"] == 2


def test_overrides_and_cli(db, tmp_path, capsys, monkeypatch):
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"{LOCAL_MODEL}:\n  input_mtok: 0.5\n  output_mtok: 1.5\n")
    assert main(["runs", "--db", db, "--json", "--prices", str(prices)]) == 0
    rows = {r["agent"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["second"]["cost_usd"] == pytest.approx((10 * 0.5 + 5 * 1.5) / 1e6)
    assert rows["helper"]["cost_usd"] == pytest.approx(OPENAI_USD + (2000 * 0.5 + 1000 * 1.5) / 1e6)
    assert main(["runs", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "unknown" in out and "2 model calls without a price" in out
    monkeypatch.setenv("AGENTTAPE_PRICES", str(prices))
    assert main(["replay", "run-second", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cost"]["unpriced_calls"] == 0
    bad = tmp_path / "bad.json"
    bad.write_text('{"m": {"input_mtok": -1, "output_mtok": 1}}')
    with pytest.raises(PricesFileError, match="negative"):
        Prices.load(bad)
    assert main(["show", "run-second", "--db", db, "--prices", str(bad)]) == 2


def test_receiver_prices_calls_as_it_stores_them(db, tmp_path, monkeypatch):
    """The receiver's cost series (by provider, model, agent, service) hold the dollars the read side
    computes for the same calls; calls without a price are counted, never priced at 0."""
    import httpx
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from prometheus_client.parser import text_string_to_metric_families

    from cost_support import recorded_spans
    from otel_agenttape.receiver.server import TapeServer

    srv = TapeServer(str(tmp_path / "live.duckdb"), http_port=0, grpc_port=0, ingest_workers=0).start()
    try:
        r = httpx.post(f"{srv.url}/v1/traces", content=encode_spans(recorded_spans()).SerializeToString(),
                       headers={"Content-Type": "application/x-protobuf"}, timeout=10)
        assert r.status_code == 200 and srv.wait_idle(10)
        samples = [s for fam in text_string_to_metric_families(httpx.get(f"{srv.url}/metrics").text)
                   for s in fam.samples]
    finally:
        srv.stop()
    usd = {(s.labels["gen_ai_agent_name"], s.labels["gen_ai_request_model"]): s.value
           for s in samples if s.name == "agenttape_gen_ai_cost_usd_total"}
    assert usd == {("planner", "gpt-4o"): pytest.approx(OPENAI_USD),
                   ("planner", "claude-3-5-sonnet-20241022"): pytest.approx(ANTHROPIC_USD),
                   ("helper", "gpt-4o"): pytest.approx(OPENAI_USD)}
    unpriced = {s.labels["gen_ai_agent_name"]: s.value for s in samples
                if s.name == "agenttape_gen_ai_unpriced_calls_total"}
    assert unpriced == {"helper": 1, "second": 1}
    with otel_agenttape.open(db) as t:  # the same dollars as the read side's
        assert sum(usd.values()) == pytest.approx(t.cost("run-planner", tree=True)["usd"])


def test_sql_reads_call_costs(db, capsys):
    """``call_costs`` in SQL: every model call with its dollars, null (not 0) without a price; the store
    itself is unchanged (it is computed in memory for the query that names it)."""
    with otel_agenttape.open(db) as t:
        by_agent = {r["agent"]: r for r in t.sql(
            "SELECT agent, sum(usd) AS usd, count(*) AS calls, count(usd) AS priced FROM call_costs "
            "GROUP BY agent").to_pylist()}
        assert by_agent["planner"]["usd"] == pytest.approx(OPENAI_USD + ANTHROPIC_USD)
        assert (by_agent["helper"]["calls"], by_agent["helper"]["priced"]) == (2, 1)
        assert by_agent["second"]["usd"] is None
        joined = t.sql("SELECT r.agent, sum(c.usd) AS usd FROM runs r JOIN call_costs c ON c.ref = r.ref "
                       "WHERE r.agent = 'planner' GROUP BY r.agent").to_pylist()
        assert joined == [{"agent": "planner", "usd": pytest.approx(OPENAI_USD + ANTHROPIC_USD)}]
        assert "call_costs" not in {r["table_name"] for r in t.sql(
            "SELECT table_name FROM duckdb_tables() UNION ALL SELECT view_name FROM duckdb_views()").to_pylist()}
    assert main(["sql", "SELECT model, usd, price FROM call_costs WHERE agent = 'second'", "--db", db]) == 0
    assert LOCAL_MODEL in capsys.readouterr().out


def test_a_page_read_again_is_priced_again_when_its_run_gains_a_call(tmp_path):
    """A run's cost is kept between pages: a model call that arrives later is priced in the next page."""
    from opentelemetry import trace as api
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanContext, TraceFlags

    from otel_agenttape.store.writer import Store

    def spans(build) -> bytes:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        build(provider.get_tracer("t"))
        return encode_spans(exporter.get_finished_spans())

    call = {"agenttape.run.id": "run-grow", "agenttape.node.type": "model", "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 1000, "gen_ai.usage.output_tokens": 500}
    seen = {}

    def first(tracer) -> None:
        with tracer.start_as_current_span("run-grow", attributes={
                "agenttape.run.id": "run-grow", "agenttape.node.type": "run", "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "grow"}) as run:
            seen["ctx"] = run.get_span_context()
            with tracer.start_as_current_span("chat gpt-4o", attributes=call):
                pass

    def second(tracer) -> None:
        ctx = api.set_span_in_context(api.NonRecordingSpan(SpanContext(
            trace_id=seen["ctx"].trace_id, span_id=seen["ctx"].span_id, is_remote=True, trace_flags=TraceFlags(1))))
        with tracer.start_as_current_span("chat gpt-4o", context=ctx, attributes=call):
            pass

    store = Store(str(tmp_path / "grow.duckdb"))
    try:
        store.write_traces([spans(first)])
        tapes = otel_agenttape.open(store)
        one = (1000 * 2.5 + 500 * 10) / 1e6
        assert [r.cost_usd for r in tapes.runs().runs] == [pytest.approx(one)]
        assert [r.cost_usd for r in tapes.runs().runs] == [pytest.approx(one)]  # kept
        store.write_traces([spans(second)])
        (run,) = tapes.runs().runs
        assert (run.model_calls, run.cost_usd, run.priced_calls) == (2, pytest.approx(2 * one), 2)
        tapes.close()
    finally:
        store.close()
