"""`agenttape demo` from a fresh folder: records through OTLP, stores, rebuilds and verifies."""

import json
import subprocess
import sys

import duckdb


def test_demo_records_a_verified_tree(tmp_path):
    db = tmp_path / "demo.duckdb"
    proc = subprocess.run([sys.executable, "-m", "otel_agenttape", "demo", "--db", str(db), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["verified"] is True
    assert sorted(r["agent"] for r in out["runs"]) == ["coordinator", "critic", "researcher"]
    tree = out["tree"]
    assert tree["agent"] == "coordinator" and tree["status"] == "completed"
    assert tree["output"].startswith("Recommendation:")
    children = {c["agent"]: c for c in tree["children"]}
    assert set(children) == {"researcher", "critic"}
    tools = children["researcher"]["tools"]
    assert [t["name"] for t in tools].count("web_search") == 2
    failing = [t for t in tools if t["name"] == "fetch_page"]
    assert failing and failing[0].get("error")
    # What the demo printed is what is in the DuckDB file.
    con = duckdb.connect(str(db), read_only=True)
    try:
        kinds = dict(con.execute(
            "SELECT node_type, count(*) FROM spans WHERE node_type IS NOT NULL GROUP BY 1").fetchall())
        retries = con.execute("SELECT count(*) FROM span_events WHERE name = 'agenttape.retry'").fetchone()[0]
        reasoning = con.execute("SELECT count(*) FROM span_events WHERE name = 'agenttape.reasoning'").fetchone()[0]
        texts = con.execute("SELECT count(*) FROM span_events WHERE name = 'agenttape.text'").fetchone()[0]
    finally:
        con.close()
    assert kinds == {"run": 3, "model": 5, "tool": 3}
    assert retries == 1 and reasoning == 5 and texts > 5
    # the demo records with the outbox on: it is there, and nothing is left in it
    from otel_agenttape import outboxfile

    box = outboxfile.summarize(tmp_path / "demo.duckdb.outbox")
    assert box.lanes == 1 and box.spans == 0 and box.dropped == 0


def test_demo_human_output_names_next_steps(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "otel_agenttape", "demo"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "agenttape.duckdb").exists()
    assert "verified" in proc.stdout and "agenttape replay" in proc.stdout
