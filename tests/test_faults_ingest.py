"""`agenttape ingest` refuses a file that is not OTLP (exit 2, the file named) and loads nothing from it;
what is already in the store stays."""

from __future__ import annotations

import json

import otel_agenttape
from faults_util import sha256
from receiver_util import trace_request

from otel_agenttape.cli import main
from otel_agenttape.store.reader import open_reader


def _spans(db: str) -> int:
    with open_reader(db) as r:
        return r.query("SELECT count(*) FROM spans").column(0)[0].as_py()


def _capture_jsonl(path, monkeypatch) -> None:
    """A real node-record file of the capture API (JsonlSink)."""
    monkeypatch.delenv("AGENTTAPE_SIGNING_KEY", raising=False)
    tape = otel_agenttape.setup(exporter=False, jsonl_path=path)
    with tape.run(agent="j", run_id="run-j") as run:
        with run.model_call(model="m", messages="hi") as call:
            call.finish(text="hello", usage={"input_tokens": 1})
        with run.tool_call("t", {"a": 1}, call_id="c") as tool:
            tool.result("ok")
    tape.shutdown()


def test_ingest_refuses_files_that_are_not_otlp(tmp_path, capsys, monkeypatch):
    db = str(tmp_path / "i.duckdb")
    good = tmp_path / "good.pb"
    good.write_bytes(trace_request(3).SerializeToString())
    assert main(["ingest", str(good), "--db", db]) == 0
    capsys.readouterr()
    before = sha256(db)

    foo = tmp_path / "foo.json"
    foo.write_text(json.dumps({"foo": 1}))
    nodes = tmp_path / "nodes.jsonl"
    _capture_jsonl(nodes, monkeypatch)
    assert len(nodes.read_text().splitlines()) == 2
    for bad, where in ((foo, f"{foo}:"), (nodes, f"{nodes}:1:")):
        assert main(["ingest", str(bad), "--db", db]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"agenttape: error: {where} not an OTLP export"), err
        assert "resourceSpans" in err
    # with a good file beside a bad one, nothing is written: every file is checked first
    other = tmp_path / "other.pb"
    other.write_bytes(trace_request(2).SerializeToString())
    assert main(["ingest", str(other), str(foo), "--db", db]) == 2
    assert str(foo) in capsys.readouterr().err
    assert sha256(db) == before and _spans(db) == 3  # what was loaded before stays, nothing was added

    junk = tmp_path / "junk.pb"
    junk.write_bytes(b"\x7a\x03abc")  # parses as protobuf, but only as an unknown field
    assert main(["ingest", str(junk), "--db", db]) == 2
    assert "not an OTLP traces protobuf request" in capsys.readouterr().err
    assert _spans(db) == 3
