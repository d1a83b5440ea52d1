"""OTLP/HTTP receiver against a real DuckDB store on 127.0.0.1: exporters, hand-built requests, every error."""

from __future__ import annotations

import gzip
import json
import os
import stat

import httpx
import pyarrow as pa
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from receiver_util import JS, PB, logs_request, span_keys, stored_keys, trace_request

from otel_agenttape.receiver.server import TapeServer, discovery_path


@pytest.fixture
def server(tmp_path):
    srv = TapeServer(str(tmp_path / "tape.duckdb"), http_port=0, grpc_port=0).start()
    yield srv
    srv.stop()


@pytest.fixture
def client():
    with httpx.Client(timeout=30) as c:
        yield c


def _status(resp: httpx.Response) -> status_pb2.Status:
    st = status_pb2.Status()
    if resp.headers["content-type"].startswith("application/json"):
        from google.protobuf import json_format

        json_format.Parse(resp.text, st, ignore_unknown_fields=True)
    else:
        st.ParseFromString(resp.content)
    return st


def test_official_http_exporter_spans_are_stored(server):
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces")
    provider = TracerProvider(resource=Resource.create({"service.name": "http-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("invoke_agent a") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        with tracer.start_as_current_span("chat m") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "m1")
            chat.set_attribute("gen_ai.usage.input_tokens", 12)
    provider.shutdown()
    assert server.wait_idle(10)
    t = server.query("SELECT name, service_name, parent_span_id, input_tokens FROM spans ORDER BY name")
    rows = t.to_pylist()
    assert [r["name"] for r in rows] == ["chat m", "invoke_agent a"]
    assert {r["service_name"] for r in rows} == {"http-test"}
    assert rows[0]["parent_span_id"] is not None and rows[1]["parent_span_id"] is None
    assert rows[0]["input_tokens"] == 12


def test_official_http_log_exporter(server):
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{server.url}/v1/logs")))
    import logging

    from opentelemetry.sdk._logs import LoggingHandler

    logger = logging.getLogger("receiver-test")
    logger.addHandler(LoggingHandler(logger_provider=lp))
    logger.warning("hello from the log exporter")
    lp.shutdown()
    assert server.wait_idle(10)
    t = server.query("SELECT body FROM log_records")
    assert t.num_rows == 1 and "hello from the log exporter" in t.column(0)[0].as_py()


def test_protobuf_and_json_requests_and_duplicates_stored_once(server, client):
    req = trace_request(4)
    for _ in range(3):  # re-sent request: same trace id + span ids
        r = client.post(f"{server.url}/v1/traces", content=req.SerializeToString(), headers=PB)
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
        assert ExportTraceServiceResponse.FromString(r.content) == ExportTraceServiceResponse()
    from google.protobuf import json_format

    doc = json.loads(json_format.MessageToJson(trace_request(2)))
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:  # OTLP JSON: hex ids, any case
        span["traceId"] = base64_to_hex(span["traceId"]).upper()
        span["spanId"] = base64_to_hex(span["spanId"])
    r = client.post(f"{server.url}/v1/traces", content=json.dumps(doc), headers=JS)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {}
    r = client.post(f"{server.url}/v1/traces", content=gzip.compress(req.SerializeToString()),
                    headers={**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 200
    keys = stored_keys(server)
    assert len(keys) == 6
    assert span_keys(req) <= keys
    json_ids = {(s["traceId"].lower(), s["spanId"]) for s in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]}
    assert json_ids <= keys
    assert server.query("SELECT count(*) AS n FROM spans").column(0)[0].as_py() == 6


def base64_to_hex(s: str) -> str:
    import base64

    return base64.b64decode(s).hex()


def test_logs_endpoint(server, client):
    r = client.post(f"{server.url}/v1/logs", content=logs_request(3).SerializeToString(), headers=PB)
    assert r.status_code == 200
    assert server.wait_idle(10)
    assert server.query("SELECT count(*) FROM log_records").column(0)[0].as_py() == 3


def test_partial_success_rejects_only_invalid_spans(server, client):
    m = client.get(f"{server.url}/metrics").text  # one series from the start: dashboards see no relabelling
    assert 'agenttape_spans_rejected_total{reason="invalid_id"} 0' in m and "agenttape_spans_rejected_total 0" not in m
    req = trace_request(4)
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[0].span_id = b"\x01\x02"
    spans[2].trace_id = bytes(16)
    good = span_keys(req) - {(spans[0].trace_id.hex(), spans[0].span_id.hex()),
                             (spans[2].trace_id.hex(), spans[2].span_id.hex())}
    r = client.post(f"{server.url}/v1/traces", content=req.SerializeToString(), headers=PB)
    assert r.status_code == 200
    resp = ExportTraceServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_spans == 2
    assert "span_id must be 8 bytes" in resp.partial_success.error_message
    assert stored_keys(server) == good
    # JSON: rejectedSpans comes back as an int64 string, in JSON
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "ok"},
        {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b71", "name": "short id"},
    ]}]}]}
    r = client.post(f"{server.url}/v1/traces", json=body)
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == "1"
    # ids that are not hex (odd length, other characters, spaces, not a string) reject their span only
    tid = "1af7651916cd43dd8448eb211c80319c"
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": tid, "spanId": "c7ad6b7169203331", "name": "kept"},
        {"traceId": "abc", "spanId": "c7ad6b7169203332", "name": "odd length"},
        {"traceId": tid, "spanId": "c7ad6b71692033zz", "name": "not hex"},
        {"traceId": " " + tid[:16] + " " + tid[16:], "spanId": "c7ad6b7169203334", "name": "spaces"},
        {"traceId": tid, "spanId": "c7ad6b7169203335", "parentSpanId": 7, "name": "not a string"},
        {"traceId": tid, "spanId": "c7ad6b7169203336", "name": "bad link",
         "links": [{"traceId": tid, "spanId": "xyz"}]},
    ]}]}]}
    r = client.post(f"{server.url}/v1/traces", json=body)
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == "5"
    assert "trace_id is not a hex string" in r.json()["partialSuccess"]["errorMessage"]
    assert server.wait_idle(5)
    assert server.query(f"SELECT name FROM spans WHERE trace_id = '{tid}'").column(0).to_pylist() == ["kept"]
    m = client.get(f"{server.url}/metrics").text
    assert 'agenttape_spans_rejected_total{reason="invalid_id"} 8' in m
    logs = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"traceId": tid, "body": {"stringValue": "kept"}}, {"traceId": "abc", "body": {"stringValue": "dropped"}}]}]}]}
    r = client.post(f"{server.url}/v1/logs", json=logs)
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedLogRecords"] == "1"


@pytest.mark.parametrize(
    "body,headers",
    [
        (b"\x0a\xff\xff\xff\xff\x0f garbage", PB),
        (b"{not json", JS),
        (json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz", "spanId": "00"}]}]}]}), JS),
        (json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 5}]}]}]}), JS),
    ],
)
def test_undecodable_is_400_with_status_body(server, client, body, headers):
    r = client.post(f"{server.url}/v1/traces", content=body, headers=headers)
    assert r.status_code == 400
    assert r.headers["content-type"] == headers["Content-Type"]
    st = _status(r)
    assert st.message
    assert any(d.Is(error_details_pb2.BadRequest.DESCRIPTOR) for d in st.details)


def test_all_spans_invalid_is_400(server, client):
    req = trace_request(2)
    for s in req.resource_spans[0].scope_spans[0].spans:
        s.trace_id = b"\x01" * 8  # wrong id length
    r = client.post(f"{server.url}/v1/traces", content=req.SerializeToString(), headers=PB)
    assert r.status_code == 400
    assert "trace_id must be 16 bytes" in _status(r).message
    assert server.wait_idle(5) and server.query("SELECT count(*) FROM spans").column(0)[0].as_py() == 0


def test_415_for_other_content_types(server, client):
    for ct in ("text/plain", "application/xml"):
        r = client.post(f"{server.url}/v1/traces", content=b"hello", headers={"Content-Type": ct})
        assert r.status_code == 415
    r = client.post(f"{server.url}/v1/traces", content=b"x", headers={**PB, "Content-Encoding": "br"})
    assert r.status_code == 415


def test_413_plain_and_gzip_bomb(tmp_path, client):
    srv = TapeServer(str(tmp_path / "small.duckdb"), http_port=0, grpc_port=0, max_body=64 * 1024).start()
    try:
        big = trace_request(400, attrs={"pad": "x" * 200}).SerializeToString()
        assert len(big) > 64 * 1024
        r = client.post(f"{srv.url}/v1/traces", content=big, headers=PB)
        assert r.status_code == 413
        packed = gzip.compress(big)
        assert len(packed) < 64 * 1024  # small on the wire, too big inflated
        r = client.post(f"{srv.url}/v1/traces", content=packed, headers={**PB, "Content-Encoding": "gzip"})
        assert r.status_code == 413
        bomb = gzip.compress(b"\0" * (50 << 20))
        r = client.post(f"{srv.url}/v1/traces", content=bomb, headers={**PB, "Content-Encoding": "gzip"})
        assert r.status_code == 413
        r = client.post(f"{srv.url}/v1/traces", content=trace_request(2).SerializeToString(), headers=PB)
        assert r.status_code == 200  # the server is fine afterwards
    finally:
        srv.stop()


def test_default_limit_is_20_mib(server):
    assert server.max_body == 20 * 1024 * 1024


def test_token_required_on_every_route_but_healthz(tmp_path, client):
    srv = TapeServer(str(tmp_path / "auth.duckdb"), http_port=0, grpc_port=0, token="s3cret").start()
    try:
        body = trace_request(1).SerializeToString()
        assert client.get(f"{srv.url}/healthz").status_code == 200
        for method, path, kw in [
            ("POST", "/v1/traces", {"content": body, "headers": PB}),
            ("POST", "/v1/logs", {"content": logs_request(1).SerializeToString(), "headers": PB}),
            ("GET", "/metrics", {}),
            ("POST", "/api/query", {"json": {"sql": "SELECT 1"}}),
        ]:
            r = client.request(method, f"{srv.url}{path}", **kw)
            assert r.status_code == 401, path
            want = PB["Content-Type"] if kw.get("headers") == PB else "application/json"
            assert r.headers["content-type"] == want and "bearer token" in _status(r).message  # the request's encoding
            bad = {**kw.get("headers", {}), "Authorization": "Bearer wrong"}
            assert client.request(method, f"{srv.url}{path}", **{**kw, "headers": bad}).status_code == 401
            good = {**kw.get("headers", {}), "Authorization": "Bearer s3cret"}
            assert client.request(method, f"{srv.url}{path}", **{**kw, "headers": good}).status_code == 200, path
        exporter = OTLPSpanExporter(endpoint=f"{srv.url}/v1/traces", headers={"Authorization": "Bearer s3cret"})
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer("t").start_span("with token").end()
        provider.shutdown()
        assert srv.wait_idle(10)
        assert srv.query("SELECT count(*) FROM spans").column(0)[0].as_py() == 2
        info = json.loads(discovery_path(srv.db).read_text())
        assert info["token"] == "s3cret"
    finally:
        srv.stop()


def test_healthz_discovery_file_and_routes(server, client):
    assert client.get(f"{server.url}/healthz").status_code == 200
    path = discovery_path(server.db)
    info = json.loads(path.read_text())
    assert info == {"url": server.url, "pid": os.getpid(), "token": None}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert client.get(f"{server.url}/nope").status_code == 404
    assert client.get(f"{server.url}/v1/traces").status_code == 405
    server.stop()
    assert not path.exists()


def test_metrics_receiver_and_genai(server, client):
    from otel_agenttape import semconv as sc

    chat = trace_request(2, attrs={sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "gpt-x",
                                   sc.GEN_AI_RESPONSE_MODEL: "gpt-x",
                                   sc.GEN_AI_USAGE_INPUT_TOKENS: 100, sc.GEN_AI_USAGE_OUTPUT_TOKENS: 7})
    tool = trace_request(3, attrs={sc.GEN_AI_OPERATION_NAME: "execute_tool", sc.GEN_AI_TOOL_NAME: "search"})
    tool.resource_spans[0].scope_spans[0].spans[0].status.code = 2
    for req in (chat, tool):
        assert client.post(f"{server.url}/v1/traces", content=req.SerializeToString(), headers=PB).status_code == 200
    assert server.wait_idle(10)
    server._genai_cache = (0.0, "")
    r = client.get(f"{server.url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = r.text
    assert 'agenttape_requests_total{code="200",signal="traces",transport="http"} 2' in m
    assert "agenttape_spans_accepted_total 5" in m
    assert "agenttape_spans_stored_total 5" in m
    assert "agenttape_queue_bytes 0" in m and "agenttape_wal_lag_records 0" in m
    assert "agenttape_ingest_latency_seconds_count 2" in m
    assert 'agenttape_genai_token_usage_tokens_total{gen_ai_response_model="gpt-x",gen_ai_token_type="input"} 200' in m
    assert 'agenttape_genai_token_usage_tokens_total{gen_ai_response_model="gpt-x",gen_ai_token_type="output"} 14' in m
    assert 'agenttape_genai_operation_duration_seconds_count{gen_ai_operation_name="chat"} 2' in m
    assert 'agenttape_genai_operation_duration_seconds_bucket{gen_ai_operation_name="chat",le="0.64"} 2' in m
    assert 'agenttape_genai_operation_duration_seconds_bucket{gen_ai_operation_name="chat",le="0.32"} 0' in m
    assert 'agenttape_genai_tool_calls_total{gen_ai_tool_name="search"} 3' in m
    assert 'agenttape_genai_tool_errors_total{gen_ai_tool_name="search"} 1' in m


def test_api_query_while_serving(server, client):
    req = trace_request(3)
    client.post(f"{server.url}/v1/traces", content=req.SerializeToString(), headers=PB)
    assert server.wait_idle(10)
    r = client.post(f"{server.url}/api/query", json={"sql": "SELECT span_id FROM spans WHERE name = ?",
                                                      "params": ["chat gpt-x 1"]})
    assert r.status_code == 200 and r.headers["content-type"] == "application/vnd.apache.arrow.stream"
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.num_rows == 1
    assert table.column("span_id")[0].as_py() == req.resource_spans[0].scope_spans[0].spans[1].span_id.hex()
    for bad in ("DELETE FROM spans", "SELECT * FROM read_text('/etc/passwd')", "ATTACH 'x.db'"):
        r = client.post(f"{server.url}/api/query", json={"sql": bad})
        assert r.status_code == 400, bad
        assert "error" in r.json()
    # the store's own reader goes through this endpoint while the server holds the file
    from otel_agenttape.store.reader import open_reader

    with open_reader(server.db) as reader:
        assert reader.query("SELECT count(*) FROM spans").column(0)[0].as_py() == 3


def test_parquet_dir_gets_the_stored_spans(tmp_path, client):
    lake = tmp_path / "lake"
    srv = TapeServer(str(tmp_path / "pq.duckdb"), http_port=0, grpc_port=0, parquet_dir=str(lake)).start()
    req = trace_request(4)
    try:
        for _ in range(2):  # the duplicate is not written twice to the lake either
            assert client.post(f"{srv.url}/v1/traces", content=req.SerializeToString(), headers=PB).status_code == 200
        assert srv.wait_idle(10)
    finally:
        srv.stop()  # flushes the sink
    import duckdb

    pattern = str(lake / "spans" / "**" / "*.parquet")
    rows = duckdb.sql(f"SELECT trace_id, span_id FROM read_parquet('{pattern}', hive_partitioning=true)").fetchall()
    assert set(rows) == span_keys(req) and len(rows) == 4


def test_chunked_body_and_keep_alive_after_errors(server, client):
    req = trace_request(3)
    body = req.SerializeToString()
    r = client.post(f"{server.url}/v1/traces", content=iter([body[:10], body[10:]]), headers=PB)  # chunked
    assert r.status_code == 200
    # the same keep-alive connection keeps working after refused requests
    assert client.post(f"{server.url}/v1/traces", content=b"x", headers={"Content-Type": "text/plain"}).status_code == 415
    assert client.post(f"{server.url}/v1/traces", content=b"\xff\xff", headers=PB).status_code == 400
    again = trace_request(1)
    assert client.post(f"{server.url}/v1/traces", content=again.SerializeToString(), headers=PB).status_code == 200
    assert stored_keys(server) == span_keys(req) | span_keys(again)


def test_json_logs_over_http(server, client):
    body = {"resourceLogs": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "j"}}]},
                              "scopeLogs": [{"logRecords": [
                                  {"timeUnixNano": "1700000000000000000", "traceId": "5B8EFFF798038103D269B633813FC60C",
                                   "spanId": "EEE19B7EC3C1B174", "eventName": "gen_ai.client.inference.operation.details",
                                   "body": {"kvlistValue": {"values": [{"key": "k", "value": {"intValue": "3"}}]}}}]}]}]}
    r = client.post(f"{server.url}/v1/logs", json=body)
    assert r.status_code == 200 and r.json() == {}
    assert server.wait_idle(10)
    row = server.query("SELECT trace_id, span_id, event_name, service_name FROM log_records").to_pylist()
    assert row == [{"trace_id": "5b8efff798038103d269b633813fc60c", "span_id": "eee19b7ec3c1b174",
                    "event_name": "gen_ai.client.inference.operation.details", "service_name": "j"}]


@pytest.mark.parametrize("media", [PB, JS])
def test_a_time_past_2_pow_63_is_400_with_a_reason_and_a_huge_step_is_not_promoted(server, client, media):
    from integrity_support import otlp_json

    def send(req):
        body = req.SerializeToString() if media is PB else otlp_json(req)
        return client.post(f"{server.url}/v1/traces", content=body, headers=media)

    req = trace_request(1)
    req.resource_spans[0].scope_spans[0].spans[0].start_time_unix_nano = 2**63 + 5
    r = send(req)
    assert r.status_code == 400 and "2262" in _status(r).message
    req = trace_request(1)
    kv = req.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="agenttape.step")
    kv.value.double_value = 1e19  # an int64 column cannot hold it: the attribute keeps it, the column stays null
    assert send(req).status_code == 200
    assert server.wait_idle(10)
    step, attrs = server.query("SELECT step, attributes FROM spans").to_pylist()[0].values()
    assert step is None and json.loads(attrs)["agenttape.step"] == {"d": "1e+19"}


@pytest.mark.parametrize("media", [PB, JS])
def test_a_kind_the_store_cannot_hold_rejects_that_span_only(server, client, media):
    from integrity_support import otlp_json

    req = trace_request(3)
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[1].kind = 1000  # an int32 on the wire; kinds OTLP may add later (6, 7...) are stored as they are
    spans[2].kind = 9
    body = req.SerializeToString() if media is PB else otlp_json(req)
    r = client.post(f"{server.url}/v1/traces", content=body, headers=media)
    assert r.status_code == 200
    if media is PB:
        partial = ExportTraceServiceResponse.FromString(r.content).partial_success
        rejected, message = partial.rejected_spans, partial.error_message
    else:
        partial = r.json()["partialSuccess"]
        rejected, message = int(partial["rejectedSpans"]), partial["errorMessage"]
    assert rejected == 1 and "kind must be between -128 and 127" in message and "1000" in message
    assert server.wait_idle(10)
    kinds = sorted(row["kind"] for row in server.query("SELECT kind FROM spans").to_pylist())
    assert kinds == sorted([spans[0].kind, 9])
    assert 'agenttape_spans_rejected_total{reason="invalid_kind"} 1' in client.get(f"{server.url}/metrics").text
