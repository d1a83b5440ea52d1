"""One --memory-limit bounds a receiver: DuckDB's buffer manager, the ingest queue, the spool and the read
model's kept reads follow it, and doctor shows each bound."""

from __future__ import annotations

import json

import pytest

from otel_agenttape import read_memory
from otel_agenttape.cli import main
from otel_agenttape.receiver.memory import MemoryBudget, parse_size
from otel_agenttape.receiver.server import TapeServer


def test_sizes_parse_with_units_and_bad_ones_say_why():
    assert parse_size("512MB") == 512 << 20
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("300m") == 300 << 20
    assert parse_size(1000) == 1000
    with pytest.raises(ValueError, match="not a size: 'lots'"):
        parse_size("lots")
    with pytest.raises(ValueError, match="below the 128 MB"):
        MemoryBudget.of("64MB")


def test_the_budget_sets_duckdb_the_queue_and_doctor(tmp_path, capsys):
    db = tmp_path / "t.duckdb"
    server = TapeServer(str(db), http_port=0, grpc_port=0, memory_limit="256MB", ingest_workers=0).start()
    try:
        limit = server.store.con.cursor().execute("SELECT current_setting('memory_limit')").fetchone()[0]
        assert limit.replace(" ", "") in ("64.0MiB", "64MiB"), limit
        assert server.pipeline.max_queue_bytes == 64 << 20
        code = main(["doctor", "--db", str(db), "--json"])
        checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
        assert code == 0
        memory = checks["receiver memory"]
        assert "budget 256 MB" in memory["detail"] and "store 64 MB" in memory["detail"]
        assert "queue 64 MB" in memory["detail"] and "spool 16 MB" in memory["detail"]
        assert "reads 32 MB" in memory["detail"]
        assert "0 converter process(es) running" in memory["detail"]
        assert "after 60 s quiet they stop" in memory["detail"]
        # what the console and the API keep between reads follows the budget, and /metrics shows it
        assert read_memory.limit() == 32 << 20
        gauges = dict(line.split(" ") for line in server.render_metrics().splitlines()
                      if line.startswith("agenttape_read_cache"))
        assert float(gauges["agenttape_read_cache_limit_bytes"]) == 32 << 20
        assert float(gauges["agenttape_read_cache_bytes"]) == read_memory.held()
    finally:
        server.stop()
        read_memory.set_limit(read_memory.DEFAULT_LIMIT)


def test_serve_refuses_a_bad_memory_limit(tmp_path, capsys):
    code = main(["serve", "--db", str(tmp_path / "x.duckdb"), "--http-port", "0", "--grpc-port", "0",
                 "--memory-limit", "12 parsecs"])
    assert code == 2
    assert "--memory-limit: not a size: '12 parsecs'" in capsys.readouterr().err
