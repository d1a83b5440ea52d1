"""Bounded ingest: a store that falls behind gets 429 / RESOURCE_EXHAUSTED, a failing one 503 / UNAVAILABLE,
both with a retry delay; nothing acknowledged is lost once the store recovers."""

from __future__ import annotations

import threading
import time

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from receiver_util import PB, BlockingStore, FailingStore, grpc_call, span_keys, stored_keys, trace_request

from otel_agenttape.receiver.server import TapeServer
from otel_agenttape.store.writer import Store


def _retry_info(st: status_pb2.Status) -> error_details_pb2.RetryInfo:
    for d in st.details:
        if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            ri = error_details_pb2.RetryInfo()
            d.Unpack(ri)
            return ri
    raise AssertionError("no RetryInfo in the status details")


@pytest.fixture
def blocked(tmp_path):
    inner = Store(str(tmp_path / "bp.duckdb"))
    store = BlockingStore(inner)
    first = trace_request(20)
    size = first.ByteSize()
    srv = TapeServer(str(tmp_path / "bp.duckdb"), http_port=0, grpc_port=0, store=store,
                     max_queue_bytes=int(size * 1.5)).start()
    yield srv, store, first
    store.release.set()
    srv.stop()
    inner.close()


def test_http_429_with_retry_after_then_recovers(blocked):
    srv, store, first = blocked
    with httpx.Client(timeout=30) as c:
        assert c.post(f"{srv.url}/v1/traces", content=first.SerializeToString(), headers=PB).status_code == 200
        assert store.entered.wait(10)  # the writer holds it, the store does not return
        second = trace_request(20)
        r = c.post(f"{srv.url}/v1/traces", content=second.SerializeToString(), headers=PB)
        assert r.status_code == 429
        assert int(r.headers["Retry-After"]) >= 1
        assert _retry_info(status_pb2.Status.FromString(r.content)).retry_delay.seconds >= 1
        big_json = {"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": f"{i:016x}", "name": "j" * 200}
            for i in range(1, 30)]}]}]}
        rj = c.post(f"{srv.url}/v1/traces", json=big_json)
        assert rj.status_code == 429 and rj.headers["content-type"] == "application/json"
        st = json_format.Parse(rj.text, status_pb2.Status())
        assert _retry_info(st).retry_delay.seconds >= 1
        assert "agenttape_backpressure_total 2" in c.get(f"{srv.url}/metrics").text
        assert srv.pipeline.queued_bytes <= srv.max_queue_bytes
        store.release.set()
        assert srv.wait_idle(20)
        assert c.post(f"{srv.url}/v1/traces", content=second.SerializeToString(), headers=PB).status_code == 200
    assert stored_keys(srv) == span_keys(first) | span_keys(second)


def test_grpc_resource_exhausted_with_retry_info(blocked):
    srv, store, first = blocked
    assert grpc_call(srv.grpc_port, first.SerializeToString())[0] == grpc.StatusCode.OK
    assert store.entered.wait(10)
    code, _, md = grpc_call(srv.grpc_port, trace_request(20).SerializeToString())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    st = status_pb2.Status.FromString(md["grpc-status-details-bin"])
    assert _retry_info(st).retry_delay.seconds >= 1
    ri = error_details_pb2.RetryInfo.FromString(md["google.rpc.retryinfo-bin"])
    assert ri.retry_delay.seconds >= 1


def test_official_exporter_retries_after_429(blocked):
    srv, store, first = blocked
    with httpx.Client() as c:
        assert c.post(f"{srv.url}/v1/traces", content=first.SerializeToString(), headers=PB).status_code == 200
    assert store.entered.wait(10)
    exporter = OTLPSpanExporter(endpoint=f"{srv.url}/v1/traces", timeout=20)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    threading.Timer(0.5, store.release.set).start()
    with tracer.start_as_current_span("x" * 60_000):  # big enough to overflow the queue while blocked
        pass
    provider.shutdown()
    assert srv.wait_idle(20)
    names = srv.query("SELECT name FROM spans WHERE length(name) = 60000").num_rows
    assert names == 1
    assert srv.metrics.get("agenttape_backpressure_total") >= 1


def test_failing_store_gives_503_and_keeps_acknowledged_data(tmp_path):
    inner = Store(str(tmp_path / "f.duckdb"))
    store = FailingStore(inner)
    srv = TapeServer(str(tmp_path / "f.duckdb"), http_port=0, grpc_port=0, store=store).start()
    try:
        first = trace_request(3)
        with httpx.Client(timeout=30) as c:
            assert c.post(f"{srv.url}/v1/traces", content=first.SerializeToString(), headers=PB).status_code == 200
            deadline = time.time() + 10
            while store.failures < 3 and time.time() < deadline:
                time.sleep(0.05)
            r = c.post(f"{srv.url}/v1/traces", content=trace_request(1).SerializeToString(), headers=PB)
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            code, _, md = grpc_call(srv.grpc_port, trace_request(1).SerializeToString())
            assert code == grpc.StatusCode.UNAVAILABLE and "google.rpc.retryinfo-bin" in md
            assert "agenttape_store_errors_total" in c.get(f"{srv.url}/metrics").text
        store.release.set()
        assert stored_keys(srv) == span_keys(first)
    finally:
        store.release.set()
        srv.stop()
        inner.close()


def test_not_ready_while_replaying_the_wal(tmp_path):
    from otel_agenttape.receiver.wal import KIND_TRACES, WriteAheadLog

    pending = trace_request(5)
    wal = WriteAheadLog(tmp_path / "w.duckdb.otlpwal")
    wal.append(KIND_TRACES, pending.SerializeToString())
    wal.close()  # left behind by a crashed server
    inner = Store(str(tmp_path / "w.duckdb"))
    store = BlockingStore(inner)
    srv = TapeServer(str(tmp_path / "w.duckdb"), http_port=0, grpc_port=0, store=store)
    starter = threading.Thread(target=srv.start)
    starter.start()
    try:
        assert store.entered.wait(20)  # replay is writing into the (blocked) store
        with httpx.Client(timeout=10) as c:
            assert c.get(f"{srv.url}/healthz").status_code == 503
            r = c.post(f"{srv.url}/v1/traces", content=trace_request(1).SerializeToString(), headers=PB)
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            assert grpc_call(srv.grpc_port, trace_request(1).SerializeToString())[0] == grpc.StatusCode.UNAVAILABLE
            store.release.set()
            starter.join(20)
            assert srv.ready and srv.replayed_records == 1
            assert c.get(f"{srv.url}/healthz").status_code == 200
        assert stored_keys(srv) == span_keys(pending)
    finally:
        store.release.set()
        starter.join(20)
        srv.stop()
        inner.close()


def test_a_readers_first_query_sees_what_was_acknowledged_before_it(tmp_path, monkeypatch):
    """A command run right after an export returned (the receiver acknowledged the spans, they wait for the
    store) reads them: the remote reader's first query waits, for a bounded time, until they are stored.
    Its later queries do not wait, and a store that stays behind past the bound is read as it is."""
    from otel_agenttape.receiver import server as server_module
    from otel_agenttape.store.readers import HttpReader

    inner = Store(str(tmp_path / "s.duckdb"))
    store = BlockingStore(inner)
    srv = TapeServer(str(tmp_path / "s.duckdb"), http_port=0, grpc_port=0, store=store, ingest_workers=0).start()
    count = "SELECT count(*) AS n FROM spans"
    try:
        first = trace_request(20)
        with httpx.Client(timeout=30) as c:
            assert c.post(f"{srv.url}/v1/traces", content=first.SerializeToString(), headers=PB).status_code == 200
        assert store.entered.wait(10)  # acknowledged, the write under way and held
        threading.Timer(0.5, store.release.set).start()
        started = time.monotonic()
        reader = HttpReader(srv.url)
        assert reader.query(count).to_pylist() == [{"n": 20}]  # waited for the write
        assert time.monotonic() - started >= 0.4
        store.release.clear()
        store.entered.clear()
        with httpx.Client(timeout=30) as c:
            assert c.post(f"{srv.url}/v1/traces", content=trace_request(5).SerializeToString(),
                          headers=PB).status_code == 200
        assert store.entered.wait(10)
        started = time.monotonic()
        assert reader.query(count).to_pylist() == [{"n": 20}]  # a later query: no wait, what is stored
        assert time.monotonic() - started < 2
        monkeypatch.setattr(server_module, "SETTLE_S", 0.3)
        started = time.monotonic()
        assert HttpReader(srv.url).query(count).to_pylist() == [{"n": 20}]  # behind past the bound: as it is
        assert 0.25 <= time.monotonic() - started < 3
    finally:
        store.release.set()
        srv.stop()
        inner.close()
