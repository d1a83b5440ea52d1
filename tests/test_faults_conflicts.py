"""A span id re-sent with other content is a conflict, not a duplicate: counted on /metrics, named by
doctor, and the stored span is kept. An identical re-send stays a duplicate."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
from faults_util import metric, serve, stop, stored_keys, wait_for
from receiver_util import PB, free_env, span_keys, trace_request

from otel_agenttape.store import rows
from otel_agenttape.store.writer import Store


def test_store_counts_conflicts_apart_from_duplicates():
    store = Store(None)
    req = trace_request(3)
    assert store.write_traces([req]).spans_stored == 3
    same = store.write_traces([req])
    assert (same.spans_stored, same.duplicates, same.conflicts) == (0, 3, 0)
    forged = type(req)()
    forged.CopyFrom(req)
    forged.resource_spans[0].scope_spans[0].spans[1].name = "forged"
    res = store.write_traces([forged])
    assert (res.spans_stored, res.duplicates, res.conflicts) == (0, 2, 1)
    sp = forged.resource_spans[0].scope_spans[0].spans[1]
    assert res.conflict_example == f"{sp.trace_id.hex()}/{sp.span_id.hex()}"
    names = store.cursor().sql("SELECT name FROM spans ORDER BY name").fetchall()
    assert [n for (n,) in names] == ["chat gpt-x 0", "chat gpt-x 1", "chat gpt-x 2"]  # the stored one is kept
    store.close()


def test_conflicts_within_one_batch_are_counted_too():
    """Requests that arrive together are stored in one write: a re-send among them is compared with
    the first copy, not only with what is already stored."""
    req = trace_request(3)
    forged = type(req)()
    forged.CopyFrom(req)
    forged.resource_spans[0].scope_spans[0].spans[0].status.code = 2
    store = Store(None)
    res = store.write_tables(rows.concat([rows.traces_to_tables([req]), rows.traces_to_tables([req]),
                                          rows.traces_to_tables([forged])]))
    assert (res.spans_stored, res.duplicates, res.conflicts) == (3, 5, 1)
    store.close()


def test_served_conflicts_are_counted_and_shown_by_doctor(tmp_path):
    db = str(tmp_path / "c.duckdb")
    proc, info = serve(db, "--ingest-workers", "0")
    url = info["url"]
    try:
        with httpx.Client(timeout=30) as c:
            req = trace_request(4)
            assert c.post(f"{url}/v1/traces", content=req.SerializeToString(), headers=PB).status_code == 200
            assert c.post(f"{url}/v1/traces", content=req.SerializeToString(), headers=PB).status_code == 200
            forged = type(req)()
            forged.CopyFrom(req)
            for sp in forged.resource_spans[0].scope_spans[0].spans[:2]:
                sp.attributes.add(key="gen_ai.usage.output_tokens").value.int_value = 999
            assert c.post(f"{url}/v1/traces", content=forged.SerializeToString(), headers=PB).status_code == 200
            assert wait_for(lambda: metric(c.get(f"{url}/metrics").text, "agenttape_spans_conflicting_total") == 2, 20)
            text = c.get(f"{url}/metrics").text
            assert metric(text, "agenttape_spans_duplicate_total") == 4 + 2
            assert sorted(stored_keys(url)) == sorted(span_keys(req))
        out = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "doctor", "--db", db, "--json"],
                             capture_output=True, text=True, env=free_env(), timeout=120)
        checks = {ch["name"]: ch for ch in json.loads(out.stdout)}
        assert out.returncode == 0  # a past conflict is reported, not a failure of the receiver now
        assert checks["conflicting spans"]["status"] == "info"
        assert checks["conflicting spans"]["data"]["agenttape_spans_conflicting_total"] == 2
        assert "other content" in checks["conflicting spans"]["detail"]
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert "re-sent span(s) differ from the stored span" in err
