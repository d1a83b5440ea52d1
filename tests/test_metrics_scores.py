"""Scores as Prometheus series: a real receiver on 127.0.0.1 fed by the capture API (scores given during a
run and afterwards, in a score tape) and by another instrumentation's log-record event, read back through
``GET /metrics`` with Prometheus' own parser."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import otel_agenttape
from otel_agenttape.receiver.server import TapeServer


def _samples(srv: TapeServer) -> list:
    return [s for fam in text_string_to_metric_families(httpx.get(f"{srv.url}/metrics", timeout=10).text)
            for s in fam.samples]


def test_scores_become_series_by_name_label_source_and_agent(tmp_path):
    srv = TapeServer(str(tmp_path / "t.duckdb"), http_port=0, grpc_port=0, ingest_workers=0).start()
    try:
        tape = otel_agenttape.setup(endpoint=srv.url, protocol="http/protobuf", service_name="shop")
        try:
            for value in (0.9, 0.4):
                with tape.run(agent="helper", input="hi") as run:
                    run.score("helpfulness", value, source="code")
                    run.set_output("hello")
            assert run.score("correctness", label="pass", source="human")  # later: a score tape of its own
            with tape.run(agent="helper") as failed:
                failed.score("judge", error_type="timeout", source="llm")
            assert tape.force_flush()
        finally:
            tape.shutdown()
        from opentelemetry._logs import LogRecord
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
        from opentelemetry.sdk.resources import Resource

        logs = LoggerProvider(resource=Resource.create({"service.name": "their-app"}))
        logs.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{srv.url}/v1/logs")))
        logs.get_logger("their.evaluator").emit(LogRecord(event_name="gen_ai.evaluation.result", attributes={
            "gen_ai.evaluation.name": "toxicity", "gen_ai.evaluation.score.value": 0.02}))
        logs.shutdown()
        assert srv.wait_idle(10)
        samples = _samples(srv)
    finally:
        srv.stop()
    counts = {(s.labels["gen_ai_evaluation_name"], s.labels.get("gen_ai_evaluation_score_label", ""),
               s.labels["agenttape_score_source"], s.labels.get("error_type", ""), s.labels.get("gen_ai_agent_name", ""),
               s.labels.get("service_name", "")): s.value
              for s in samples if s.name == "agenttape_evaluation_scores_total"}
    assert counts == {("helpfulness", "", "code", "", "helper", "shop"): 2,
                      ("correctness", "pass", "human", "", "", "shop"): 1,
                      ("judge", "", "llm", "timeout", "helper", "shop"): 1,
                      ("toxicity", "", "otel", "", "", "their-app"): 1}
    by = {(s.name, s.labels["gen_ai_evaluation_name"], s.labels.get("le")): s.value for s in samples
          if s.name.startswith("agenttape_evaluation_score_value")}
    assert by[("agenttape_evaluation_score_value_sum", "helpfulness", None)] == pytest.approx(1.3)
    assert by[("agenttape_evaluation_score_value_bucket", "helpfulness", "0.5")] == 1
    assert by[("agenttape_evaluation_score_value_count", "helpfulness", None)] == 2
    assert ("agenttape_evaluation_score_value_count", "judge", None) not in by  # a failed evaluation has no value
