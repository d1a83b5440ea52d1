"""`agenttape doctor` reports the store, a running receiver, and makes rejected data visible."""

import json
import os

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_agenttape.cli import main
from otel_agenttape.receiver.server import TapeServer


def _doctor(capsys, db):
    code = main(["doctor", "--db", str(db), "--json"])
    return code, {c["name"]: c for c in json.loads(capsys.readouterr().out)}


def test_doctor_without_store_fails_with_a_hint(tmp_path, capsys):
    code, checks = _doctor(capsys, tmp_path / "missing.duckdb")
    assert code == 1
    assert "agenttape serve" in checks["store"]["detail"]


def test_doctor_reports_past_rejections_without_failing(tmp_path, capsys):
    db = tmp_path / "t.duckdb"
    server = TapeServer(str(db), http_port=0, grpc_port=0)
    server.start()
    try:
        code, checks = _doctor(capsys, db)
        assert code == 0 and checks["receiver counters"]["ok"]
        req = ExportTraceServiceRequest()
        spans = req.resource_spans.add().scope_spans.add()
        good = spans.spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="ok",
                               start_time_unix_nano=1, end_time_unix_nano=2)
        assert good
        spans.spans.add(trace_id=b"\x01" * 16, span_id=b"\x03" * 3, name="bad id",
                        start_time_unix_nano=1, end_time_unix_nano=2)
        resp = httpx.post(f"http://127.0.0.1:{server.http_port}/v1/traces", content=req.SerializeToString(),
                          headers={"Content-Type": "application/x-protobuf"})
        assert resp.status_code == 200
        assert server.wait_idle(30)
        code, checks = _doctor(capsys, db)
    finally:
        server.stop()
    # a span refused before is reported, with its reason, but the receiver works now: exit 0
    assert code == 0
    counters = checks["receiver counters"]
    assert counters["ok"] is True
    assert counters["data"]["agenttape_spans_rejected_total"] == 1
    assert counters["data"]["agenttape_spans_stored_total"] == 1
    past = checks["past losses"]
    assert past["status"] == "info" and "1 spans rejected (invalid_id: 1)" in past["detail"]


def test_doctor_offline_counts_what_is_stored(tmp_path, capsys):
    db = tmp_path / "t.duckdb"
    server = TapeServer(str(db), http_port=0, grpc_port=0)
    server.start()
    server.stop()
    code, checks = _doctor(capsys, db)
    assert code == 0
    assert checks["store"]["data"]["spans"] == 0


def test_doctor_checks_the_signing_key(tmp_path, capsys, monkeypatch):
    db = tmp_path / "t.duckdb"
    TapeServer(str(db), http_port=0, grpc_port=0).start().stop()
    assert main(["keygen", "--out", str(tmp_path / "k"), "--name", "doc"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("AGENTTAPE_SIGNING_KEY", str(tmp_path / "k.key"))
    code, checks = _doctor(capsys, db)
    assert code == 0 and checks["signing key"]["ok"] and checks["signing key"]["data"]["vkey"].startswith("doc+")
    for bad, why in ((tmp_path / "missing.key", "cannot read"), (tmp_path / "k.pub", "not a private signing key")):
        monkeypatch.setenv("AGENTTAPE_SIGNING_KEY", str(bad))
        code, checks = _doctor(capsys, db)
        assert code == 1 and not checks["signing key"]["ok"] and why in checks["signing key"]["detail"]
    monkeypatch.delenv("AGENTTAPE_SIGNING_KEY")
    assert "signing key" not in _doctor(capsys, db)[1]


def test_doctor_says_which_compiled_paths_run(tmp_path, capsys):
    import subprocess
    import sys

    from otel_agenttape import native

    _, checks = _doctor(capsys, tmp_path / "missing.duckdb")
    states = checks["compiled paths"]["data"]
    assert set(states) == set(native.MODULES)
    off = os.environ.get("AGENTTAPE_NO_NATIVE", "") not in ("", "0")  # the suite may run with the pure path
    want = (lambda n: "turned off (AGENTTAPE_NO_NATIVE)") if off else (
        lambda n: "compiled" if native.load(n) else "not built")
    assert all(state == want(n) for n, state in states.items())
    # turned off in another process: every module says so
    out = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "doctor", "--db", str(tmp_path / "x.duckdb"),
                          "--json"], capture_output=True, text=True, env={**__import__("os").environ,
                                                                          "AGENTTAPE_NO_NATIVE": "1"})
    off = {c["name"]: c for c in json.loads(out.stdout)}["compiled paths"]
    assert all(s.startswith("turned off") for s in off["data"].values()) and off["ok"]
