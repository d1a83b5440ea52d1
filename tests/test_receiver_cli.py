"""`agenttape ingest` (JSON, JSON lines, protobuf, gzip; into the file or through a running server) and
`agenttape serve` options."""

from __future__ import annotations

import gzip
import json

import pytest
from google.protobuf import json_format
from receiver_util import logs_request, span_keys, trace_request

from otel_agenttape import cli
from otel_agenttape.receiver.server import TapeServer
from otel_agenttape.store.reader import open_reader


def _otlp_json(req) -> dict:
    """OTLP JSON as exporters write it: hex ids, int enums."""
    doc = json.loads(json_format.MessageToJson(req, use_integers_for_enums=True))
    import base64

    for key in ("resourceSpans", "resourceLogs"):
        for r in doc.get(key, []):
            for s in r.get("scopeSpans", []) + r.get("scopeLogs", []):
                for item in s.get("spans", []) + s.get("logRecords", []):
                    for f in ("traceId", "spanId", "parentSpanId"):
                        if f in item:
                            item[f] = base64.b64decode(item[f]).hex().upper()
    return doc


def _keys(db: str) -> set[tuple[str, str]]:
    with open_reader(db) as r:
        t = r.query("SELECT trace_id, span_id FROM spans")
    return set(zip(t.column("trace_id").to_pylist(), t.column("span_id").to_pylist()))


def test_ingest_every_file_format(tmp_path, capsys):
    a, b, c, d = trace_request(2), trace_request(3), trace_request(1), trace_request(4)
    logs = logs_request(2)
    (tmp_path / "one.json").write_text(json.dumps(_otlp_json(a)))
    lines = "\n".join(json.dumps(_otlp_json(x)) for x in (b, logs)) + "\n"
    (tmp_path / "collector.jsonl").write_text(lines)
    (tmp_path / "req.pb").write_bytes(c.SerializeToString())
    (tmp_path / "req.pb.gz").write_bytes(gzip.compress(d.SerializeToString()))
    db = str(tmp_path / "ing.duckdb")
    files = [str(tmp_path / n) for n in ("one.json", "collector.jsonl", "req.pb", "req.pb.gz")]
    assert cli.main(["ingest", *files, "--db", db, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["spans"] == 10 and summary["logs"] == 2 and summary["rejected"] == 0
    assert _keys(db) == span_keys(a) | span_keys(b) | span_keys(c) | span_keys(d)
    assert cli.main(["ingest", files[0], "--db", db]) == 0  # again: stored once
    assert len(_keys(db)) == 10


def test_ingest_validation_and_errors(tmp_path, capsys):
    req = trace_request(3)
    req.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x01"
    (tmp_path / "partial.pb").write_bytes(req.SerializeToString())
    (tmp_path / "broken.json").write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "nothex"}]}]}]}')
    db = str(tmp_path / "v.duckdb")
    assert cli.main(["ingest", str(tmp_path / "partial.pb"), "--db", db]) == 1  # stored the rest, reported
    assert "1 rejected" in capsys.readouterr().out
    assert len(_keys(db)) == 2
    assert cli.main(["ingest", str(tmp_path / "broken.json"), "--db", db]) == 2
    assert "not valid hex" in capsys.readouterr().err
    assert cli.main(["ingest", str(tmp_path / "missing.json"), "--db", db]) == 2


def test_ingest_goes_through_the_running_server(tmp_path, capsys):
    db = str(tmp_path / "served.duckdb")
    req = trace_request(5)
    (tmp_path / "r.pb").write_bytes(req.SerializeToString())
    srv = TapeServer(db, http_port=0, grpc_port=0, token="t0k").start()
    try:
        assert cli.main(["ingest", str(tmp_path / "r.pb"), "--db", db, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["target"] == srv.url
        assert srv.wait_idle(10)
        assert len(srv.query("SELECT span_id FROM spans")) == 5
    finally:
        srv.stop()
    assert _keys(db) == span_keys(req)


def test_serve_defaults_from_environment(monkeypatch):
    monkeypatch.setenv("AGENTTAPE_DB", "/tmp/x.duckdb")
    monkeypatch.setenv("AGENTTAPE_HTTP_PORT", "0")
    monkeypatch.setenv("AGENTTAPE_GRPC_PORT", "5317")
    monkeypatch.setenv("AGENTTAPE_TOKEN", "envtok")
    args = cli._build_parser().parse_args(["serve"])
    assert (args.db, args.host, args.http_port, args.grpc_port, args.token) == (
        "/tmp/x.duckdb", "127.0.0.1", 0, 5317, "envtok")
    with pytest.raises(SystemExit):
        cli._build_parser().parse_args(["serve", "--http-port", "notaport"])


def test_read_commands_work_while_the_server_holds_the_db(tmp_path):
    import subprocess
    import sys

    from receiver_util import PB, free_env

    db = str(tmp_path / "busy.duckdb")
    srv = TapeServer(db, http_port=0, grpc_port=0, token="rt").start()
    try:
        import httpx

        req = trace_request(3)
        assert httpx.post(f"{srv.url}/v1/traces", content=req.SerializeToString(),
                          headers={**PB, "Authorization": "Bearer rt"}).status_code == 200
        assert srv.wait_idle(10)
        for argv in (["sql", "SELECT count(*) AS n FROM spans", "--json"], ["runs", "--json"]):
            out = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", *argv, "--db", db],
                                 capture_output=True, text=True, env=free_env(), timeout=60)
            assert out.returncode == 0, out.stderr
            if argv[0] == "sql":
                assert json.loads(out.stdout) == [{"n": 3}]
        refused = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "sql",
                                  "SELECT * FROM read_text('/etc/passwd')", "--db", db],
                                 capture_output=True, text=True, env=free_env(), timeout=60)
        assert refused.returncode != 0 and "root:" not in refused.stdout
    finally:
        srv.stop()
