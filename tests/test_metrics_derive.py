"""Metrics derived from ingested spans: a real receiver on 127.0.0.1 fed by the demo agents and by
hand-made OTLP requests, read back through ``GET /metrics`` with Prometheus' own text parser."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from receiver_util import trace_request

from otel_agenttape import semconv as sc
from otel_agenttape.receiver.server import TapeServer

PB = {"Content-Type": "application/x-protobuf"}


def scrape(srv: TapeServer) -> dict[str, list]:
    """{sample name: [(labels, value), ...]} of one scrape."""
    text = httpx.get(f"{srv.url}/metrics", timeout=10).text
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def post(srv: TapeServer, req) -> None:
    r = httpx.post(f"{srv.url}/v1/traces", content=req.SerializeToString(), headers=PB, timeout=10)
    assert r.status_code == 200, r.text
    assert srv.wait_idle(10)


@pytest.fixture
def server(tmp_path):
    srv = TapeServer(str(tmp_path / "tape.duckdb"), http_port=0, grpc_port=0, ingest_workers=0).start()
    yield srv
    srv.stop()


def feed_demo(srv: TapeServer) -> None:
    from otel_agenttape.capture.setup import setup
    from otel_agenttape.demo import run_demo_agents

    tape = setup(endpoint=f"http://127.0.0.1:{srv.http_port}", protocol="http/protobuf", service_name="agenttape-demo")
    try:
        run_demo_agents(tape)
    finally:
        tape.shutdown()
    assert srv.wait_idle(30)


def test_demo_spans_become_genai_and_agent_metrics(server):
    feed_demo(server)
    m = scrape(server)
    stored = server.query("SELECT sum(input_tokens) AS i, sum(output_tokens) AS o, "
                          "count(*) FILTER (WHERE node_type = 'model') AS models FROM spans").to_pylist()[0]
    model = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "demo", "gen_ai_request_model": "demo-model-1",
             "service_name": "agenttape-demo"}
    assert value(m, "gen_ai_client_token_usage_sum", gen_ai_token_type="input", **model) == stored["i"]
    assert value(m, "gen_ai_client_token_usage_sum", gen_ai_token_type="output", **model) == stored["o"]
    assert value(m, "gen_ai_client_token_usage_count", gen_ai_token_type="input") == stored["models"] == 5
    # semconv buckets: le="1" .. le="67108864", cumulative, +Inf equals the count
    buckets = [(lab["le"], v) for lab, v in m["gen_ai_client_token_usage_bucket"]
               if lab["gen_ai_token_type"] == "input" and lab["gen_ai_agent_name"] == "coordinator"]
    assert [b for b, _ in buckets][:3] == ["1.0", "4.0", "16.0"] and buckets[-1] == ("+Inf", 2)
    assert len(buckets) == 15 and all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))
    assert value(m, "gen_ai_client_operation_duration_seconds_count", **model) == 5
    assert value(m, "gen_ai_client_operation_time_to_first_chunk_seconds_count", **model) == 5  # streamed
    for agent, steps in (("coordinator", 2), ("researcher", 2), ("critic", 1)):
        assert value(m, "agenttape_runs_total", gen_ai_agent_name=agent, status="completed") == 1
        assert value(m, "agenttape_run_duration_seconds_count", gen_ai_agent_name=agent) == 1
        assert value(m, "agenttape_run_steps_sum", gen_ai_agent_name=agent) == steps
    assert value(m, "agenttape_tool_calls_total", gen_ai_tool_name="web_search") == 2
    assert value(m, "agenttape_tool_errors_total", gen_ai_tool_name="fetch_page", error_type="ConnectionError") == 1
    assert value(m, "agenttape_tool_errors_total", gen_ai_tool_name="web_search") == 0
    assert value(m, "agenttape_tool_duration_seconds_count") == 3
    assert value(m, "agenttape_chain_links_checked_total") == 10  # every link after the first of the tape
    assert value(m, "agenttape_chain_verification_failures_total") == 0
    assert value(m, "agenttape_store_written_bytes_total") > 0 and value(m, "agenttape_store_bytes") > 0
    assert "agenttape_queue_lag_seconds" in m


def test_resent_spans_are_counted_once(server):
    req = trace_request(3, attrs={sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "m1",
                                  sc.GEN_AI_USAGE_INPUT_TOKENS: 10})
    post(server, req)
    post(server, req)  # a client retry: the store keeps one copy, the metrics count one
    m = scrape(server)
    assert value(m, "gen_ai_client_token_usage_sum", gen_ai_request_model="m1") == 30
    assert value(m, "agenttape_spans_duplicate_total") == 3


def test_error_type_and_operation_duration_buckets(server):
    req = trace_request(2, attrs={sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "m2",
                                  "error.type": "RateLimitError"})
    for sp in req.resource_spans[0].scope_spans[0].spans:
        sp.status.code = 2
    post(server, req)
    m = scrape(server)
    # each span lasts 0.5 s: counted from le="0.64" on, not in le="0.32"
    b = {lab["le"]: v for lab, v in m["gen_ai_client_operation_duration_seconds_bucket"]
         if lab["error_type"] == "RateLimitError"}
    assert b["0.32"] == 0 and b["0.64"] == 2 and b["+Inf"] == 2


def _sealed(chain_id: str, links: list[tuple[int, str, str]]):
    req = trace_request(len(links), attrs={sc.GEN_AI_OPERATION_NAME: "chat"})
    for sp, (seq, prev, hsh) in zip(req.resource_spans[0].scope_spans[0].spans, links):
        for k, v in ((sc.CHAIN_ID, chain_id), (sc.CHAIN_PREV, prev), (sc.CHAIN_HASH, hsh)):
            a = sp.attributes.add()
            a.key, a.value.string_value = k, v
        a = sp.attributes.add()
        a.key, a.value.int_value = sc.CHAIN_SEQ, seq
    return req


def test_chain_breaks_are_counted_as_spans_arrive(server):
    cid = "c" * 32
    post(server, _sealed(cid, [(0, "genesis", "h0"), (1, "h0", "h1")]))
    # the next batch continues from the remembered link h1, but seq 3 claims a predecessor that is not h2
    post(server, _sealed(cid, [(2, "h1", "h2"), (3, "forged", "h3")]))
    post(server, _sealed(cid, [(3, "h2", "h3-other")]))  # seq 3 again with another hash: a fork
    m = scrape(server)
    assert value(m, "agenttape_chain_verification_failures_total", reason="prev_mismatch") == 1
    assert value(m, "agenttape_chain_verification_failures_total", reason="seq_reused") == 1
    assert value(m, "agenttape_chain_links_checked_total") == 4  # seq 1, 2, 3 and the second seq 3


def test_label_values_are_capped_with_an_other_bucket(server):
    from otel_agenttape.receiver.genai_metrics import LABEL_CAPS

    cap = LABEL_CAPS["gen_ai_request_model"]
    for i in range(cap + 10):
        post(server, trace_request(1, attrs={sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: f"model-{i}",
                                             sc.GEN_AI_USAGE_OUTPUT_TOKENS: 1}))
    m = scrape(server)
    models = {lab["gen_ai_request_model"] for lab, _ in m["gen_ai_client_token_usage_count"]}
    assert len(models) == cap + 1 and "_other" in models
    assert value(m, "gen_ai_client_token_usage_count", gen_ai_request_model="_other") == 10
    assert value(m, "gen_ai_client_token_usage_sum") == cap + 10  # nothing lost, only folded


def test_derivation_can_be_turned_off(tmp_path):
    srv = TapeServer(str(tmp_path / "off.duckdb"), http_port=0, grpc_port=0, ingest_workers=0,
                     span_metrics=False).start()
    try:
        post(srv, trace_request(2, attrs={sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_USAGE_INPUT_TOKENS: 5}))
        m = scrape(srv)
        assert value(m, "agenttape_spans_stored_total") == 2
        assert not [k for k in m if k.startswith(("gen_ai_", "agenttape_runs", "agenttape_genai_"))]
    finally:
        srv.stop()


def test_counters_added_by_name_are_exposed(server):
    """Any part of the receiver counts a new thing with ``metrics.inc`` and it is on /metrics."""
    server.metrics.inc("agenttape_spans_conflicting_total", 2)
    server.metrics.inc("agenttape_spans_conflicting_total", 1)
    text = httpx.get(f"{server.url}/metrics").text
    assert "# TYPE agenttape_spans_conflicting_total counter" in text
    assert "agenttape_spans_conflicting_total 3.0" in text


def _prometheus_client_text(span_metrics) -> str:
    """Every family of ``span_metrics`` rendered by ``prometheus_client.generate_latest`` as a whole."""
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(span_metrics)
    return generate_latest(reg).decode("utf-8")


def test_cached_rendering_is_the_text_prometheus_client_renders():
    """Scrapes format only the series that changed: the text must stay what generate_latest gives for
    the whole state, batch after batch, including a series that appears late and odd label values."""
    from otel_agenttape.receiver.genai_metrics import SpanMetrics
    from otel_agenttape.store import rows
    from otel_agenttape.store.samples import genai_requests

    sm = SpanMetrics()
    first = sm.render_text()
    assert first == _prometheus_client_text(sm)
    assert sm.render_text() is first  # nothing changed: the text of the scrape before
    runs = genai_requests(n_runs=4, models_per_run=2, tools_per_run=2, seed=11)
    odd = trace_request(2, attrs={sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: 'm "q" \\ \n2',
                                  sc.GEN_AI_USAGE_INPUT_TOKENS: 3_000_000})
    with_input = 0
    for req in [*runs[:2], odd, *runs[2:], odd]:
        tables = rows.traces_to_tables([req.SerializeToString()]).as_dict()
        with_input += len(tables["spans"].column("input_tokens").drop_null())
        sm.observe(tables)
        text = sm.render_text()
        assert text == _prometheus_client_text(sm)
    assert 'gen_ai_request_model="m \\"q\\" \\\\ \\n2"' in text
    # Go float formatting of the odd model's 4 x 3,000,000 tokens, changed after its first render
    assert any(line.startswith("gen_ai_client_token_usage_sum{") and line.endswith('"} 1.2e+07')
               for line in text.splitlines())
    assert sum(v for lab, v in _samples(text, "gen_ai_client_token_usage_count")
               if lab["gen_ai_token_type"] == "input") == with_input > 4


def _samples(text: str, name: str):
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                yield s.labels, s.value


def test_a_scrape_after_new_spans_shows_them(server):
    """The second scrape of a receiver must not be the cached text of the first once spans arrived."""
    attrs = {sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "m3", sc.GEN_AI_USAGE_INPUT_TOKENS: 7}
    post(server, trace_request(2, attrs=attrs))
    m1 = scrape(server)
    assert scrape(server) == m1
    post(server, trace_request(3, attrs=attrs))
    m2 = scrape(server)
    assert value(m1, "gen_ai_client_token_usage_sum", gen_ai_request_model="m3") == 14
    assert value(m2, "gen_ai_client_token_usage_sum", gen_ai_request_model="m3") == 35
    assert value(m2, "gen_ai_client_token_usage_count", gen_ai_request_model="m3") == 5
    assert value(m2, "agenttape_spans_stored_total") == 5


def test_rows_containing_finds_each_string_with_the_needle():
    """The byte scan that picks the failed spans naming an ``error.type``: offsets of sliced, nullable
    and large-string arrays, a needle split across two strings (no match) and two needles in one."""
    import pyarrow as pa

    from otel_agenttape.receiver.genai_metrics import _rows_containing

    a = pa.array(['x"error.type":1', None, "no", '"error.type":"error.type":', 'ab"error.', 'type":', '"error.type":'])
    for arr in (a, a.slice(2), a.slice(1, 4), a.cast(pa.large_string())):
        expected = [i for i, v in enumerate(arr.to_pylist()) if v and '"error.type":' in v]
        assert _rows_containing(arr, b'"error.type":').tolist() == expected
    assert _rows_containing(a.slice(4, 2), b'"error.type":').tolist() == []


def test_run_steps_taken_in_the_batch_match_remembering_each_run():
    """Runs whose inner spans and run span share a batch get their step without being remembered:
    the steps and the runs left open must be those of remembering every run and then taking it."""
    import random

    import numpy as np
    import pyarrow as pa

    from otel_agenttape.receiver import run_steps

    def reference(remembered: dict, ids: list, steps: list, is_run: list) -> list:
        order: dict = {}
        for r, s, run in zip(ids, steps, is_run):
            if not run and r is not None and s is not None:
                order[r] = max(order.get(r, s), s)
        for r, s in order.items():
            if s > remembered.get(r, -1):
                remembered[r] = s
        return [remembered.pop(r, 0) if r and run else 0 for r, run in zip(ids, is_run) if run]

    rng = random.Random(5)
    for _ in range(300):
        names = [f"r{i}" for i in range(rng.randrange(1, 8))] + ["", None]
        n = rng.randrange(1, 30)
        ids = [rng.choice(names) for _ in range(n)]
        steps = [rng.choice([None, -2, 0, 1, 2, 5]) for _ in range(n)]
        is_run = [rng.random() < 0.3 for _ in range(n)]
        before = {r: rng.randrange(0, 4) for r in names[:-2] if rng.random() < 0.4}
        expected = dict(before)
        want = reference(expected, ids, steps, is_run)
        runs = run_steps.OpenRuns()
        runs.highest = dict(before)
        got = runs.observe(pa.array(ids, pa.string()), pa.array(steps, pa.int64()), np.array(is_run, dtype=bool))
        assert got.tolist() == want
        assert list(runs.highest.items()) == list(expected.items())
