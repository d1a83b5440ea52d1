"""Helpers shared by the receiver tests: request builders, a raw gRPC caller, query helpers."""

from __future__ import annotations

import os
import secrets
import threading
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def trace_request(n: int = 3, trace_id: bytes | None = None, name: str = "chat gpt-x", attrs: dict | None = None,
                  service: str = "svc") -> ExportTraceServiceRequest:
    """A request with ``n`` spans of one trace, each with its own span id."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", service
    ss = rs.scope_spans.add()
    ss.scope.name = "test"
    tid = trace_id or secrets.token_bytes(16)
    for i in range(n):
        sp = ss.spans.add()
        sp.trace_id = tid
        sp.span_id = secrets.token_bytes(8)
        sp.name = f"{name} {i}"
        sp.kind = 3
        sp.start_time_unix_nano = 1_700_000_000_000_000_000 + i
        sp.end_time_unix_nano = 1_700_000_000_500_000_000 + i
        for k, v in (attrs or {}).items():
            a = sp.attributes.add()
            a.key = k
            if isinstance(v, bool):
                a.value.bool_value = v
            elif isinstance(v, int):
                a.value.int_value = v
            else:
                a.value.string_value = str(v)
    return req


def logs_request(n: int = 2) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    sl = rl.scope_logs.add()
    for i in range(n):
        rec = sl.log_records.add()
        rec.time_unix_nano = 1_700_000_000_000_000_000 + i
        rec.event_name = "gen_ai.client.inference.operation.details"
        rec.body.string_value = f"record {i} {secrets.token_hex(4)}"
        rec.trace_id = secrets.token_bytes(16)
        rec.span_id = secrets.token_bytes(8)
    return req


def span_keys(req: ExportTraceServiceRequest) -> set[tuple[str, str]]:
    return {
        (s.trace_id.hex(), s.span_id.hex())
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }


def grpc_call(port: int, body: bytes, service: str = "trace", metadata: Any = None,
              compression: Any = None) -> tuple[grpc.StatusCode, bytes | None, dict[str, Any]]:
    """Call Export with raw bytes; returns (code, response bytes or None, trailing metadata)."""
    path = (
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        if service == "trace"
        else "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        call = ch.unary_unary(path)
        try:
            resp, c = call.with_call(body, metadata=metadata, timeout=20, compression=compression)
            return c.code(), resp, dict(c.trailing_metadata() or ())
        except grpc.RpcError as exc:
            return exc.code(), None, dict(exc.trailing_metadata() or ())


def stored_keys(server: Any) -> set[tuple[str, str]]:
    assert server.wait_idle(30)
    t = server.query("SELECT trace_id, span_id FROM spans")
    return set(zip(t.column("trace_id").to_pylist(), t.column("span_id").to_pylist()))


class BlockingStore:
    """Wraps a real store; writes wait until ``release`` is set (a store that fell behind)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.release = threading.Event()
        self.entered = threading.Event()

    def write_traces(self, reqs: Any) -> Any:
        self.entered.set()
        self.release.wait(60)
        return self.inner.write_traces(reqs)

    def write_logs(self, reqs: Any) -> Any:
        self.release.wait(60)
        return self.inner.write_logs(reqs)

    def reader(self) -> Any:
        return self.inner.reader()

    def close(self) -> None:
        self.inner.close()


class FailingStore(BlockingStore):
    """Writes raise until ``release`` is set (a store that cannot write)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.failures = 0

    def write_traces(self, reqs: Any) -> Any:
        if not self.release.is_set():
            self.failures += 1
            raise OSError("disk unavailable")
        return self.inner.write_traces(reqs)


def free_env() -> dict[str, str]:
    """Environment for subprocesses without AGENTTAPE_* overrides from the caller."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENTTAPE_")}
