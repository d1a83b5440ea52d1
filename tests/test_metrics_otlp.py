"""`agenttape serve --metrics-otlp-endpoint`: the same metrics pushed over OTLP/HTTP to a collector,
here a small OTLP metrics receiver on 127.0.0.1 that keeps every request it gets."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from receiver_util import free_env, trace_request

from otel_agenttape import semconv as sc
from otel_agenttape.receiver.otlp_metrics import metrics_url
from otel_agenttape.receiver.server import TapeServer


class _Collector(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[ExportMetricsServiceRequest] = []
        self.paths: list[str] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def metrics(self) -> dict[str, list]:
        """{metric name: [metric, ...]} over every request so far."""
        out: dict[str, list] = {}
        for req in list(self.requests):
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out.setdefault(m.name, []).append(m)
        return out


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = ExportMetricsServiceRequest.FromString(body)
        self.server.requests.append(req)
        self.server.paths.append(self.path)
        out = ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def collector():
    c = _Collector()
    yield c
    c.shutdown()
    c.server_close()


def _attrs(point) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


def test_server_pushes_the_scraped_metrics_over_otlp(tmp_path, collector):
    srv = TapeServer(str(tmp_path / "t.duckdb"), http_port=0, grpc_port=0, ingest_workers=0,
                     metrics_otlp_endpoint=collector.url, metrics_otlp_interval=0.2).start()
    try:
        req = trace_request(4, attrs={sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_PROVIDER_NAME: "openai",
                                      sc.GEN_AI_REQUEST_MODEL: "gpt-x", sc.GEN_AI_USAGE_INPUT_TOKENS: 25})
        r = httpx.post(f"{srv.url}/v1/traces", content=req.SerializeToString(),
                       headers={"Content-Type": "application/x-protobuf"})
        assert r.status_code == 200 and srv.wait_idle(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            usage = collector.metrics().get("gen_ai.client.token.usage", [])
            if usage and usage[-1].histogram.data_points and usage[-1].histogram.data_points[0].count == 4:
                break
            time.sleep(0.1)
    finally:
        srv.stop()
    assert collector.paths and set(collector.paths) == {"/v1/metrics"}
    got = collector.metrics()
    usage = got["gen_ai.client.token.usage"][-1]
    assert usage.unit == "{token}"
    point = usage.histogram.data_points[0]
    assert point.count == 4 and point.sum == 100
    assert _attrs(point) == {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                             "gen_ai.request.model": "gpt-x", "gen_ai.token.type": "input", "service.name": "svc"}
    assert list(point.explicit_bounds)[:3] == [1, 4, 16] and sum(point.bucket_counts) == 4
    assert point.bucket_counts[3] == 4  # 25 tokens: in (16, 64]
    dur = got["gen_ai.client.operation.duration"][-1]
    assert dur.unit == "s" and dur.histogram.data_points[0].count == 4
    stored = got["agenttape_spans_stored"][-1]  # a counter: a cumulative monotonic sum, without _total
    assert stored.sum.is_monotonic and stored.sum.aggregation_temporality == 2
    dp = stored.sum.data_points[0]
    assert (dp.as_int if dp.HasField("as_int") else dp.as_double) == 4
    assert "agenttape_queue_bytes" in got and got["agenttape_queue_bytes"][-1].HasField("gauge")
    # the final export at stop: no request lost the last values
    assert len(collector.requests) >= 2
    assert srv.metrics.get("agenttape_metrics_otlp_exports_total", result="ok") == len(collector.requests)


def test_metrics_otlp_endpoint_url_rules():
    assert metrics_url("http://collector:4318") == "http://collector:4318/v1/metrics"
    assert metrics_url("http://collector:4318/") == "http://collector:4318/v1/metrics"
    assert metrics_url("http://c:4318/custom/path") == "http://c:4318/custom/path"
    with pytest.raises(ValueError, match="http"):
        metrics_url("collector:4318")


def test_cli_flag_pushes_metrics(tmp_path, collector):
    db = tmp_path / "cli.duckdb"
    proc = subprocess.Popen([sys.executable, "-m", "otel_agenttape", "serve", "--db", str(db), "--http-port", "0",
                             "--grpc-port", "0", "--json", "--metrics-otlp-endpoint", collector.url,
                             "--metrics-otlp-interval", "0.3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=free_env())
    try:
        info = json.loads(proc.stdout.readline())
        assert httpx.get(f"{info['url']}/healthz").status_code == 200
        deadline = time.monotonic() + 15
        while not collector.requests and time.monotonic() < deadline:
            time.sleep(0.1)
        assert collector.requests, "no OTLP metrics request arrived"
        assert "agenttape_ready" in collector.metrics()
    finally:
        proc.terminate()
        proc.wait(30)
