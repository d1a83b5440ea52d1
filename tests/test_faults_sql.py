"""A read is a read: none of the write and escape attempts of ``sql_write_attempts.json`` changes a byte
of the store file, through a local `agenttape sql --db FILE` or through a running `agenttape serve`
(``POST /api/query`` and `agenttape sql` found through the discovery file), and each gets a clear error.

The corpus is data (``{"sql", "why"}``; ``{db}`` stands for the store's path) so a benchmark reuses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from faults_util import metric, serve, sha256, stop
from receiver_util import free_env

from otel_agenttape.cli import main
from otel_agenttape.store import samples
from otel_agenttape.store.writer import Store

ATTEMPTS = json.loads((Path(__file__).parent / "sql_write_attempts.json").read_text(encoding="utf-8"))


def _sql(attempt: dict, db: str) -> str:
    return attempt["sql"].replace("{db}", os.path.abspath(db))


@pytest.fixture
def store_file(tmp_path):
    db = str(tmp_path / "tape.duckdb")
    with Store(db) as store:
        store.write_traces(samples.genai_requests(n_runs=2))
    assert not os.path.exists(db + ".wal")  # closed with a checkpoint: the file alone holds the store
    return db


def _content(db: str) -> list:
    with Store(db) as store:  # no server holds it now
        cur = store.cursor()
        return cur.sql("SELECT trace_id, span_id, name, attributes FROM spans ORDER BY 1, 2").fetchall()


def test_the_corpus_is_large_and_explained():
    assert len(ATTEMPTS) >= 30
    assert all(set(a) == {"sql", "why"} and a["why"] for a in ATTEMPTS)
    kinds = " ".join(a["sql"].upper() for a in ATTEMPTS)
    for needle in ("WITH X AS (DELETE", "EXPLAIN ANALYZE", "PRAGMA", "CREATE MACRO", "READ_TEXT", "READ_PARQUET",
                   "GLOB(", "COPY", "ATTACH", "INSTALL", "LOAD", "SET ", "RESET", "CHECKPOINT", "; DELETE",
                   "BEGIN", "COMMIT", "CREATE TEMP", "VACUUM", "DETACH", "USE "):
        assert needle in kinds, needle


def test_local_sql_refuses_every_attempt_and_the_file_keeps_every_byte(store_file, capsys):
    before = sha256(store_file)
    for attempt in ATTEMPTS:
        code = main(["sql", _sql(attempt, store_file), "--db", store_file])
        err = capsys.readouterr().err
        assert code == 2, (attempt, err)
        assert err.startswith("agenttape: error: ") and len(err.strip()) > len("agenttape: error:") + 5, attempt
        assert "Traceback" not in err
    assert sha256(store_file) == before
    assert not os.path.exists(store_file + ".wal")
    assert main(["sql", "SELECT count(*) AS n FROM spans", "--db", store_file, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 8}]


def test_local_sql_as_a_process_refuses_a_cte_delete(store_file):
    before = sha256(store_file)
    out = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "sql",
                          "WITH x AS (DELETE FROM spans RETURNING *) SELECT count(*) FROM x", "--db", store_file],
                         capture_output=True, text=True, env=free_env(), timeout=120)
    assert out.returncode == 2 and "read-only: the query would write" in out.stderr, out.stderr
    assert sha256(store_file) == before


def test_served_sql_refuses_every_attempt_and_the_file_keeps_every_byte(store_file, capsys):
    before = sha256(store_file)
    content = _content(store_file)
    assert sha256(store_file) == before  # opening and closing a store that needs nothing writes nothing
    proc, info = serve(store_file, "--ingest-workers", "0")
    try:
        url = info["url"]
        with httpx.Client(timeout=60) as c:
            for attempt in ATTEMPTS:
                r = c.post(f"{url}/api/query", json={"sql": _sql(attempt, store_file)})
                assert r.status_code == 400, (attempt, r.status_code, r.text)
                message = r.json()["error"]
                assert isinstance(message, str) and len(message) > 5, attempt
                # the same through `agenttape sql`, which finds the server through <db>.serve.json
                code = main(["sql", _sql(attempt, store_file), "--db", store_file])
                err = capsys.readouterr().err
                assert code == 2 and err.startswith("agenttape: error: "), (attempt, err)
            ok = c.post(f"{url}/api/query", json={"sql": "SELECT count(*) AS n FROM spans"})
            assert ok.status_code == 200
            assert pa.ipc.open_stream(ok.content).read_all().column("n").to_pylist() == [8]
            metrics = c.get(f"{url}/metrics").text
            # `agenttape sql` refuses what the text alone shows before asking; the server counts the rest
            assert len(ATTEMPTS) < metric(metrics, "agenttape_queries_refused_total") < 2 * len(ATTEMPTS)
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert sha256(store_file) == before
    assert _content(store_file) == content
