"""A runaway query is interrupted at the query timeout and holds nothing other requests wait for."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest
from faults_util import serve, stop
from receiver_util import trace_request

from otel_agenttape.cli import main
from otel_agenttape.store.writer import Store

# three-way self cross join: 2,000 spans make 8e9 rows; the hash keeps DuckDB from skipping any
RUNAWAY = ("SELECT count(*) AS n FROM spans a, spans b, spans c "
           "WHERE hash(a.span_id || b.span_id || c.span_id) = 42")


@pytest.fixture
def big_store(tmp_path):
    db = str(tmp_path / "big.duckdb")
    with Store(db) as store:
        store.write_traces([trace_request(500) for _ in range(4)])
    return db


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_served_query_is_interrupted_and_blocks_nothing(big_store):
    proc, info = serve(big_store, "--ingest-workers", "0", "--query-timeout", "8")
    url = info["url"]
    result: dict = {}

    def runaway() -> None:
        start = time.monotonic()
        with httpx.Client(timeout=60) as c:
            r = c.post(f"{url}/api/query", json={"sql": RUNAWAY})
        result.update(status=r.status_code, body=r.json(), seconds=time.monotonic() - start)

    try:
        t = threading.Thread(target=runaway)
        cpu0 = _cpu_seconds(proc.pid)
        t.start()
        time.sleep(1.0)
        with httpx.Client(timeout=30) as c:  # while the runaway query runs
            one = c.post(f"{url}/api/query", json={"sql": "SELECT 1 AS one"})
            assert one.status_code == 200
            assert c.get(f"{url}/metrics").status_code == 200
            assert c.get(f"{url}/healthz").status_code == 200
            assert t.is_alive()  # answered before the runaway query ended: nothing waited for it
        t.join(30)
        assert result["status"] == 408, result
        assert "interrupted" in result["body"]["error"] and "8 s" in result["body"]["error"]
        assert 7.5 < result["seconds"] < 30
        busy = _cpu_seconds(proc.pid) - cpu0
        assert busy > 0.2  # it did run
        time.sleep(0.5)
        cpu1 = _cpu_seconds(proc.pid)
        time.sleep(2.0)
        assert _cpu_seconds(proc.pid) - cpu1 < 0.5  # and stopped once interrupted
        with httpx.Client(timeout=30) as c:
            # a request may ask for less than the server's limit
            start = time.monotonic()
            r = c.post(f"{url}/api/query", json={"sql": RUNAWAY, "timeout": 1})
            assert r.status_code == 408 and time.monotonic() - start < 15
            assert c.post(f"{url}/api/query", json={"sql": "SELECT 1", "timeout": "x"}).status_code == 400
            text = c.get(f"{url}/metrics").text
            assert "agenttape_queries_timed_out_total 2" in text
    finally:
        code, err = stop(proc)
    assert code == 0, err


def test_local_sql_timeout(big_store, capsys):
    start = time.monotonic()
    assert main(["sql", RUNAWAY, "--db", big_store, "--timeout", "1"]) == 2
    assert time.monotonic() - start < 15  # the query alone would run for minutes
    err = capsys.readouterr().err
    assert "interrupted after its 1 s timeout" in err
    assert main(["sql", "SELECT count(*) AS n FROM spans", "--db", big_store, "--json"]) == 0
    assert '"n": 2000' in capsys.readouterr().out
