"""`agenttape runs`, `agenttape sql` and `agenttape export parquet` on a real DuckDB file."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from otel_agenttape.cli import main
from otel_agenttape.store import samples
from otel_agenttape.store.writer import Store


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "cli.duckdb")
    with Store(path) as store:
        store.write_traces(samples.genai_requests(n_runs=3))
    return path


def test_runs_text_and_json(db, capsys):
    assert main(["runs", "--db", db]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["ref", "agent", "source", "status"] and "(3 rows)" in out
    assert main(["runs", "--db", db, "--json", "--limit", "2"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in runs] == ["run-7-2", "run-7-1"]  # newest first
    assert runs[0]["model_calls"] == 2 and runs[0]["tool_calls"] == 1 and runs[0]["status"] == "completed"
    assert runs[0]["ref"] == f"run-7-2@{runs[0]['trace_id']}" and runs[0]["source"] == "agenttape"


def test_sql_formats_and_refusals(db, capsys):
    assert main(["sql", "SELECT run_id, count(*) AS n FROM nodes GROUP BY run_id ORDER BY run_id", "--db", db,
                 "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows == [["run_id", "n"], ["run-7-0", "3"], ["run-7-1", "3"], ["run-7-2", "3"]]
    assert main(["sql", "SELECT 1 AS one", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"one": 1}]
    for bad in ("DELETE FROM spans", "SELECT * FROM read_text('/etc/passwd')", "ATTACH 'x.db'", "COPY spans TO 'x'"):
        assert main(["sql", bad, "--db", db]) == 2
        err = capsys.readouterr().err
        assert err.startswith("agenttape: error:") and "root:" not in err
    assert main(["sql", "SELECT count(*) AS n FROM spans", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 12}]


def test_missing_db_is_exit_2(tmp_path, capsys):
    assert main(["runs", "--db", str(tmp_path / "nope.duckdb")]) == 2
    assert "no tape store" in capsys.readouterr().err


def test_export_parquet_then_query_the_lake(db, tmp_path, capsys):
    lake = str(tmp_path / "lake")
    assert main(["export", "parquet", lake, "--db", db, "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["rows"]
    assert counts["spans"] == 12 and counts["span_events"] == 21
    assert main(["export", "parquet", lake, "--db", db]) == 2  # refuses to mix with an earlier export
    assert "already holds" in capsys.readouterr().err
    assert main(["runs", "--db", lake, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3


def test_cli_process_env_default_db(db):
    env = dict(os.environ, AGENTTAPE_DB=db)
    out = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "sql", "SELECT count(*) AS n FROM runs",
                          "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"n": 3}]


def test_sql_csv_uses_plain_newlines(db, capsys):
    assert main(["sql", "SELECT 1 AS a, 'x' AS b UNION ALL SELECT 2, 'y' ORDER BY a", "--db", db, "--csv"]) == 0
    assert capsys.readouterr().out == "a,b\n1,x\n2,y\n"


def test_sql_into_a_closed_pipe_exits_0_quietly(db):
    proc = subprocess.Popen([sys.executable, "-m", "otel_agenttape", "sql", "SELECT * FROM range(100000)",
                             "--db", db], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"range"
    proc.stdout.close()  # as `| head -1` does
    assert proc.wait(60) == 0
    assert proc.stderr.read() == b""


def test_export_of_an_empty_store_is_a_readable_lake(tmp_path, capsys):
    db, lake = str(tmp_path / "empty.duckdb"), str(tmp_path / "lake")
    Store(db).close()
    assert main(["export", "parquet", lake, "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]["run_traces"] == 0
    assert main(["runs", "--db", lake, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["sql", "SELECT count(*) AS n FROM spans", "--db", lake, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 0}]
    (tmp_path / "plain").mkdir()
    assert main(["runs", "--db", str(tmp_path / "plain")]) == 2
    assert "not a Parquet lake" in capsys.readouterr().err


def test_broken_or_empty_db_file_is_not_called_locked(tmp_path, capsys):
    for content in (b"", b"garbage, not a database\n"):
        bad = tmp_path / "bad.duckdb"
        bad.write_bytes(content)
        for argv in (["runs", "--db", str(bad)], ["sql", "SELECT 1", "--db", str(bad)],
                     ["ingest", str(tmp_path / "t.json"), "--db", str(bad)]):
            (tmp_path / "t.json").write_text('{"resourceSpans": []}')
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert err.startswith(f"agenttape: error: cannot open {bad}:") and "not a valid DuckDB database" in err
            assert "locked" not in err and len(err.splitlines()) == 1


def _hold_lock(path: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "import duckdb, sys\nc = duckdb.connect(sys.argv[1])\n"
                             "print('ready', flush=True)\nsys.stdin.read()", path],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_db_in_use_by_another_process_is_one_line_exit_2(db, tmp_path, capsys):
    (tmp_path / "t.json").write_text('{"resourceSpans": []}')
    holder = _hold_lock(db)
    try:
        for argv, prefix in ((["demo", "--db", db], "cannot run the demo: "),
                             (["ingest", str(tmp_path / "t.json"), "--db", db], ""),
                             (["serve", "--db", db, "--http-port", "0", "--grpc-port", "0"],
                              "cannot start the receiver: ")):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert err == f"agenttape: error: {prefix}{db} is in use by another process (pid {holder.pid})\n"
        assert main(["runs", "--db", db]) == 2
        assert f"{db} is locked by another process (pid {holder.pid})" in capsys.readouterr().err
    finally:
        holder.stdin.close()
        holder.wait(30)


def test_store_that_cannot_be_created_is_exit_2(tmp_path, capsys):
    (tmp_path / "t.json").write_text('{"resourceSpans": []}')
    missing = str(tmp_path / "no" / "dir" / "x.duckdb")
    folder = tmp_path / "folder"
    folder.mkdir()
    for argv in (["demo", "--db", missing], ["demo", "--db", str(folder)],
                 ["ingest", str(tmp_path / "t.json"), "--db", missing],
                 ["serve", "--db", missing, "--http-port", "0", "--grpc-port", "0"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("agenttape: error: ") and "cannot open" in err and len(err.splitlines()) == 1


def test_runs_lists_a_run_whose_run_span_never_arrived(tmp_path, capsys):
    """A process that died mid-run leaves node spans only: `runs` lists it as incomplete."""
    from opentelemetry import trace

    from otel_agenttape import semconv as sc

    t = 1_767_225_600_000_000_000

    def record(tracer):
        run = tracer.start_span("invoke_agent ok", start_time=t, attributes={
            sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "ok", sc.RUN_ID: "done"})
        tracer.start_span("chat m", context=trace.set_span_in_context(run), start_time=t + 1, attributes={
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.RUN_ID: "done", sc.NODE_TYPE: "model"}).end(end_time=t + 2)
        run.end(end_time=t + 3)
        # the crashed run: its run span never ended (never exported), only its finished nodes
        crashed = trace.set_span_in_context(tracer.start_span("invoke_agent crashy", start_time=t + 9))
        for i, (kind, op) in enumerate([("model", sc.OP_CHAT), ("tool", sc.OP_EXECUTE_TOOL), ("model", sc.OP_CHAT)]):
            tracer.start_span(f"{op} x", context=crashed, start_time=t + 10 + i, attributes={
                sc.GEN_AI_OPERATION_NAME: op, sc.GEN_AI_AGENT_NAME: "crashy", sc.RUN_ID: "crashed",
                sc.SESSION_ID: "s-1", sc.NODE_TYPE: kind, sc.GEN_AI_USAGE_INPUT_TOKENS: 5}).end(end_time=t + 20 + i)

    db = str(tmp_path / "c.duckdb")
    store = Store(db)
    store.write_traces(samples.sdk_requests(record))
    store.close()
    assert main(["runs", "--db", db, "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"done", "crashed"}
    c = rows["crashed"]
    assert (c["status"], c["agent"], c["session_id"]) == ("incomplete", "crashy", "s-1")
    # tokens are the model calls' (the tool span's count is not usage), as replay sums them
    assert (c["model_calls"], c["tool_calls"], c["input_tokens"], c["incomplete"]) == (2, 1, 10, True)
    assert rows["done"]["status"] == "completed" and rows["done"]["model_calls"] == 1
