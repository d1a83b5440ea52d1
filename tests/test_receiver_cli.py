"""`agenttape ingest` (JSON, JSON lines, protobuf, gzip; into the file or through a running server) and
`agenttape serve` options."""

from __future__ import annotations

import gzip
import json
import os

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
    # a span whose id is not hex is rejected like one with a wrong-length id: the rest is stored
    assert cli.main(["ingest", str(tmp_path / "broken.json"), "--db", db]) == 1
    assert "1 rejected (rejected spans: 1 with trace_id is not a hex string)" in capsys.readouterr().out
    (tmp_path / "broken2.json").write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}')
    assert cli.main(["ingest", str(tmp_path / "broken2.json"), "--db", db]) == 2  # not a request at all
    assert "invalid OTLP JSON" in capsys.readouterr().err
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
    # the port variables are read when serve runs, so a bad one cannot break other commands
    ports = (cli._port(args.http_port, "HTTP_PORT", 4318), cli._port(args.grpc_port, "GRPC_PORT", 4317))
    assert (args.db, args.host, *ports, args.token) == ("/tmp/x.duckdb", "127.0.0.1", 0, 5317, "envtok")
    args = cli._build_parser().parse_args(["serve", "--http-port", "7000"])
    assert cli._port(args.http_port, "HTTP_PORT", 4318) == 7000
    with pytest.raises(SystemExit):
        cli._build_parser().parse_args(["serve", "--http-port", "notaport"])


def test_bad_port_variable_breaks_only_serve(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("AGENTTAPE_HTTP_PORT", "abc")
    db = str(tmp_path / "none.duckdb")
    assert cli.main(["runs", "--db", db]) == 2  # parsed fine; fails only on the missing store
    assert "no tape store" in capsys.readouterr().err
    assert cli.main(["serve", "--db", db]) == 2
    assert "AGENTTAPE_HTTP_PORT='abc' is not a port number" in capsys.readouterr().err
    monkeypatch.setenv("AGENTTAPE_HTTP_PORT", "70000")
    assert cli.main(["serve", "--db", db]) == 2
    assert "between 0 and 65535" in capsys.readouterr().err
    assert not os.path.exists(db)


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


def test_ingest_tells_json_from_protobuf_by_name_then_content(tmp_path, capsys):
    db = str(tmp_path / "fmt.duckdb")
    req = trace_request(2)
    doc = json.dumps(_otlp_json(req)).encode()
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + doc)  # a UTF-8 BOM, as some editors write
    (tmp_path / "noext").write_bytes(b"\xef\xbb\xbf  " + doc)
    (tmp_path / "pretty.json.gz").write_bytes(gzip.compress(json.dumps(_otlp_json(req), indent=2).encode()))
    assert cli.main(["ingest", *(str(tmp_path / n) for n in ("bom.json", "noext", "pretty.json.gz")),
                     "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spans"] == 6
    # a protobuf request whose first field is 123 bytes long starts with "\n{": read as protobuf by its name,
    # and by content when it has no known extension
    odd = trace_request(1, service="svc" + "x" * (0x7B - trace_request(1).resource_spans[0].ByteSize()))
    raw = odd.SerializeToString()
    assert raw[:2] == b"\n{"
    for name in ("odd.binpb", "odd-export"):
        (tmp_path / name).write_bytes(raw)
        assert cli.main(["ingest", str(tmp_path / name), "--db", db, "--json"]) == 0, name
        assert json.loads(capsys.readouterr().out)["spans"] == 1


def test_ingest_reports_the_real_json_error_and_empty_files(tmp_path, capsys):
    db = str(tmp_path / "err.duckdb")
    # a pretty-printed document broken on line 3: the whole-document error, with its position
    (tmp_path / "broken.json").write_text('{\n  "resourceSpans": [\n    {,}\n  ]\n}\n')
    assert cli.main(["ingest", str(tmp_path / "broken.json"), "--db", db]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'broken.json'}: invalid JSON:" in err and "line 3" in err and "broken.json:1" not in err
    # JSON lines with one bad line: that line's error
    good = json.dumps(_otlp_json(trace_request(1)))
    (tmp_path / "lines.jsonl").write_text(f"{good}\n{good}\n{{\"resourceSpans\": [\n")
    assert cli.main(["ingest", str(tmp_path / "lines.jsonl"), "--db", db]) == 2
    assert f"{tmp_path / 'lines.jsonl'}:3: invalid JSON" in capsys.readouterr().err
    # a .json name holding protobuf bytes: a JSON error, not a silent protobuf guess
    (tmp_path / "proto.json").write_bytes(trace_request(1).SerializeToString())
    assert cli.main(["ingest", str(tmp_path / "proto.json"), "--db", db]) == 2
    assert "invalid JSON" in capsys.readouterr().err
    for name, content in (("empty.json", b""), ("blank.jsonl", b"\n \n"), ("empty.pb", b""),
                          ("empty.json.gz", gzip.compress(b""))):
        (tmp_path / name).write_bytes(content)
        assert cli.main(["ingest", str(tmp_path / name), "--db", db]) == 2, name
        assert f"no OTLP data in {tmp_path / name}" in capsys.readouterr().err
    assert not os.path.exists(db)


def test_ingest_counts_duplicates_or_says_the_server_does(tmp_path, capsys):
    db = str(tmp_path / "dup.duckdb")
    (tmp_path / "r.pb").write_bytes(trace_request(3).SerializeToString())
    assert cli.main(["ingest", str(tmp_path / "r.pb"), "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["duplicates"] == 0
    assert cli.main(["ingest", str(tmp_path / "r.pb"), "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["duplicates"] == 3
    assert cli.main(["ingest", str(tmp_path / "r.pb"), "--db", db]) == 0
    assert "; 3 already stored (duplicates)" in capsys.readouterr().out
    srv = TapeServer(db, http_port=0, grpc_port=0).start()
    try:
        assert cli.main(["ingest", str(tmp_path / "r.pb"), "--db", db, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["duplicates"] is None  # the server's response cannot say
        assert cli.main(["ingest", str(tmp_path / "r.pb"), "--db", db]) == 0
        assert "duplicates are counted by the server" in capsys.readouterr().out
    finally:
        srv.stop()
