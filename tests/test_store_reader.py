"""Readers: a DuckDB file, a file held by a running server (through POST /api/query), errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from otel_agenttape.store import samples
from otel_agenttape.store.reader import HttpReader, QueryError, StoreError, discovery_path, open_reader
from otel_agenttape.store.writer import Store

SERVER = textwrap.dedent(
    """
    import json, os, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from otel_agenttape.store import samples
    from otel_agenttape.store.queryapi import handle_query
    from otel_agenttape.store.writer import Store

    db, token = sys.argv[1], sys.argv[2] or None
    store = Store(db)
    store.write_traces(samples.genai_requests(n_runs=2))

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            if self.path != "/api/query":
                self.send_error(404)
                return
            if token and self.headers.get("Authorization") != f"Bearer {token}":
                body = json.dumps({"error": "unauthorized"}).encode()
                self.send_response(401)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, ctype, body = handle_query(store.reader(), data)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    info = {"url": f"http://127.0.0.1:{srv.server_port}", "pid": os.getpid(), "token": token}
    fd = os.open(db + ".serve.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, json.dumps(info).encode())
    os.close(fd)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # run until the test closes stdin
    srv.shutdown()
    store.close()
    """
)


@pytest.fixture
def served_db(tmp_path, request):
    token = getattr(request, "param", "")
    db = str(tmp_path / "served.duckdb")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, db, token],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield db
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)


def test_file_reader_reads_views(tmp_path):
    db = str(tmp_path / "f.duckdb")
    with Store(db) as store:
        store.write_traces(samples.genai_requests(n_runs=2))
    with open_reader(db) as reader:
        assert reader.kind == "duckdb"
        runs = reader.query("SELECT run_id, model_nodes, tool_nodes FROM runs ORDER BY run_id").to_pylist()
        assert runs == [{"run_id": "run-7-0", "model_nodes": 2, "tool_nodes": 1},
                        {"run_id": "run-7-1", "model_nodes": 2, "tool_nodes": 1}]
        with pytest.raises(QueryError):
            reader.query("INSERT INTO resources VALUES ('x', '{}', NULL, 0)")


def test_locked_db_goes_through_the_running_server(served_db):
    with open_reader(served_db) as reader:
        assert isinstance(reader, HttpReader)
        out = reader.query("SELECT count(*) AS n FROM spans WHERE run_id = ?", ["run-7-1"])
        assert out.column("n").to_pylist() == [4]
        big = reader.query("SELECT start_time_unix_nano, attributes FROM spans ORDER BY start_time_unix_nano")
        assert big.num_rows == 8 and big.column(0).type.bit_width == 64
        with pytest.raises(QueryError, match="(?i)read-only"):
            reader.query("DELETE FROM spans")
        with pytest.raises(QueryError, match="(?i)permission|disabled"):
            reader.query("SELECT * FROM read_text('/etc/passwd')")


@pytest.mark.parametrize("served_db", ["s3cret"], indirect=True)
def test_server_token_from_discovery_file(served_db):
    info = json.loads(open(discovery_path(served_db)).read())
    assert info["token"] == "s3cret"
    assert oct(os.stat(discovery_path(served_db)).st_mode & 0o777) == "0o600"
    with open_reader(served_db) as reader:
        assert reader.query("SELECT count(*) FROM runs").column(0).to_pylist() == [2]
    with pytest.raises(StoreError, match="401"):
        HttpReader(info["url"], token="wrong").query("SELECT 1")


def test_locked_without_discovery_is_a_clear_error(tmp_path):
    db = str(tmp_path / "held.duckdb")
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from otel_agenttape.store.writer import Store; s = Store(sys.argv[1]); "
         "print('ready', flush=True); sys.stdin.read()", db],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match="locked by another process"):
            open_reader(db)
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)


def test_missing_db_and_non_lake_folder(tmp_path):
    with pytest.raises(StoreError, match="no tape store"):
        open_reader(str(tmp_path / "absent.duckdb"))
    with pytest.raises(StoreError, match="not a Parquet lake"):
        open_reader(str(tmp_path))


def test_unreachable_server_is_a_clear_error(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(StoreError, match="cannot reach"):
        HttpReader(f"http://127.0.0.1:{port}", timeout=2).query("SELECT 1")


def test_export_parquet_through_the_running_server(served_db, tmp_path):
    from otel_agenttape.store.parquet import export_parquet, lake_dataset

    with open_reader(served_db) as reader:
        counts = export_parquet(reader, str(tmp_path / "lake"))
    assert counts["spans"] == 8 and counts["span_events"] == 14 and counts["resources"] == 1
    assert lake_dataset(str(tmp_path / "lake"), "spans").count_rows() == 8
    with open_reader(str(tmp_path / "lake")) as lake:
        assert lake.query("SELECT count(*) FROM runs").column(0).to_pylist() == [2]


def test_query_batches_streams_every_row_and_survives_other_queries(tmp_path) -> None:
    """A DuckDB reader streams a query in batches on a cursor of its own: queries made on the reader
    between two batches neither end nor disturb the stream; a bad query is a QueryError; a store held
    by a running writer (its gated reader) hands out the same rows."""
    db = str(tmp_path / "b.duckdb")
    store = Store(db)
    store.write_traces(samples.genai_requests(n_runs=6))
    want = store.reader().query("SELECT span_id FROM spans ORDER BY span_id").column(0).to_pylist()
    gated = [b.num_rows for b in store.reader().query_batches("SELECT span_id FROM spans", None, rows=3)]
    assert sum(gated) == len(want) and max(gated) <= 3
    store.close()
    reader = open_reader(db)
    try:
        got = []
        for rb in reader.query_batches("SELECT span_id FROM spans ORDER BY span_id", None, rows=2):
            assert rb.num_rows <= 2
            got += rb.column(0).to_pylist()
            assert reader.query("SELECT count(*) AS n FROM spans").column(0)[0].as_py() == len(want)
        assert got == want and len(want) > 4
        with pytest.raises(QueryError):
            list(reader.query_batches("SELECT nope FROM spans"))
    finally:
        reader.close()


def test_submit_runs_a_query_beside_the_caller_with_the_same_answer(tmp_path) -> None:
    """``submit`` gives the table ``query`` gives (from a reader thread, on a cursor of its own, for a
    DuckDB file; in the caller for a store a writer holds), and a bad query's error when asked."""
    db = str(tmp_path / "s.duckdb")
    store = Store(db)
    store.write_traces(samples.genai_requests(n_runs=3))
    sql = "SELECT span_id, name FROM spans ORDER BY span_id"
    gated = store.reader()
    assert gated.submit(sql).result().to_pylist() == gated.query(sql).to_pylist()
    store.close()
    reader = open_reader(db)
    try:
        futures = [reader.submit(sql) for _ in range(6)]
        direct = reader.query(sql).to_pylist()
        assert direct and all(f.result(timeout=30).to_pylist() == direct for f in futures)
        with pytest.raises(QueryError):
            reader.submit("SELECT nope FROM spans").result(timeout=30)
    finally:
        reader.close()


def test_rows_are_the_query_rows_from_every_thread_and_a_bad_query_is_a_query_error(tmp_path) -> None:
    """``rows`` (a lookup's rows, fetched without an Arrow table) gives what ``query(...).to_pylist()``
    gives for the lookups a rebuild makes (text, integers, NULLs, parameters), from a DuckDB file read by
    several threads at once and from a store a writer holds (under its gate)."""
    import threading

    db = str(tmp_path / "r.duckdb")
    store = Store(db)
    store.write_traces(samples.genai_requests(n_runs=4))
    sql = ("SELECT trace_id, span_id, parent_span_id, kind, start_time_unix_nano, run_id, "
           "CAST(attributes AS VARCHAR) AS attributes FROM spans WHERE start_time_unix_nano >= ? ORDER BY span_id")
    gated = store.reader()
    want = gated.query(sql, [0]).to_pylist()
    assert len(want) > 4 and any(r["parent_span_id"] is None for r in want)
    assert gated.rows(sql, [0]) == want
    assert gated.submit_rows(sql, [0]).result(30) == want  # run under the gate, before it returns
    store.close()
    reader = open_reader(db)
    try:
        assert reader.rows(sql, [0]) == want
        assert reader.rows(sql, [2**62]) == []
        started = [reader.submit_rows(sql, [0]) for _ in range(4)]  # in reader threads, side by side
        assert all(f.result(30) == want for f in started)
        with pytest.raises(QueryError):
            reader.submit_rows("SELECT nope FROM spans").result(30)
        got: list = []

        def read() -> None:
            got.append(reader.rows(sql, [0]))

        threads = [threading.Thread(target=read) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(got) == 6 and all(g == want for g in got)
        with pytest.raises(QueryError):
            reader.rows("SELECT nope FROM spans")
    finally:
        reader.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_submit_works_in_a_forked_child_after_the_parent_used_it(tmp_path) -> None:
    """A child forked after its parent ran queries side by side makes reader threads of its own (the
    parent's are not there to run them)."""
    db = str(tmp_path / "f.duckdb")
    store = Store(db)
    store.write_traces(samples.genai_requests(n_runs=1))
    store.close()
    code = textwrap.dedent(f"""
        import os, sys
        from otel_agenttape.store.reader import open_reader
        r = open_reader({db!r})
        n = r.submit("SELECT count(*) AS n FROM spans").result(timeout=30).column(0)[0].as_py()
        r.close()
        pid = os.fork()
        if pid == 0:
            r = open_reader({db!r})
            m = r.submit("SELECT count(*) AS n FROM spans").result(timeout=30).column(0)[0].as_py()
            os._exit(0 if m == n else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
