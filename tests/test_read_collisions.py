"""A run id reused by two traces (a script run twice) is two runs: listed twice, never merged.

Through a real ``agenttape serve`` and the CLI: a bare ambiguous id is refused with the candidates
(exit 2); ``RUN_ID@TRACE_ID`` opens each run with its own tool calls, status and example.
"""

from __future__ import annotations

import json

import pytest

import otel_agenttape
from otel_agenttape.cli import main
from read_support import HERE, Served, wait_for


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = Served(str(tmp_path_factory.mktemp("nightly") / "tapes.duckdb"))
    try:
        server.script(str(HERE / "read_nightly.py"), server.url, "1")
        server.script(str(HERE / "read_nightly.py"), server.url, "2", "fail")
        yield server
    finally:
        server.stop()


def _runs(served, capsys):
    capsys.readouterr()
    assert main(["runs", "--db", served.db, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def refs(served):
    def two():
        with otel_agenttape.open(served.db) as tapes:
            rows = tapes.runs(agent="nightly").runs
        return rows if len(rows) == 2 and all(r.tool_calls == 1 for r in rows) else None

    rows = wait_for(two)
    assert rows, "the two runs were not stored"
    by_day = {r.session_id: r for r in rows}
    return by_day["day-1"].ref, by_day["day-2"].ref


def test_runs_lists_both_with_their_own_status(served, refs, capsys):
    capsys.readouterr()
    assert main(["runs", "--db", served.db, "--status", "error", "--agent", "nightly", "--json"]) == 0
    assert [r["ref"] for r in json.loads(capsys.readouterr().out)] == [refs[1]]
    assert main(["runs", "--db", served.db, "--session", "day-1", "--source", "agenttape", "--json"]) == 0
    assert [r["ref"] for r in json.loads(capsys.readouterr().out)] == [refs[0]]
    rows = [r for r in _runs(served, capsys) if r["run_id"] == "nightly-report"]
    assert sorted(r["ref"] for r in rows) == sorted(refs)
    assert {r["session_id"]: (r["status"], r["tool_calls"], r["errors"]) for r in rows} == {
        "day-1": ("completed", 1, 0), "day-2": ("error", 1, 1)}


@pytest.mark.parametrize("verb", [["replay"], ["show"], ["replay", "--tree"], ["dataset", "-", "--agent", "nightly"]])
def test_a_bare_ambiguous_id_is_refused_with_the_candidates(served, refs, capsys, verb):
    capsys.readouterr()
    if verb[0] == "dataset":
        # dataset picks runs by filters, not by id: it writes one example per run, never one merged
        assert main([*verb, "--db", served.db, "--json"]) == 0
        captured = capsys.readouterr()
        examples = [json.loads(line) for line in captured.out.splitlines() if line.strip()]
        assert len(examples) == 1 and "Day 1: 100 sold." in json.dumps(examples[0])
        assert "Day 2" not in captured.out and '"status=error": 1' in captured.err
        return
    argv = [verb[0], "nightly-report", *verb[1:], "--db", served.db]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "names 2 runs" in err and all(ref in err for ref in refs)


def test_each_ref_opens_its_own_run(served, refs, capsys):
    done, failed = refs
    docs = {}
    for ref in refs:
        capsys.readouterr()
        assert main(["replay", ref, "--json", "--db", served.db]) == 0
        docs[ref] = json.loads(capsys.readouterr().out)
    assert [(t["name"], t["arguments"]) for t in docs[done]["tools"]] == [("fetch_sales", {"day": 1})]
    assert [(t["name"], t["arguments"]) for t in docs[failed]["tools"]] == [("fetch_sales", {"day": 2})]
    assert docs[done]["status"] == "completed" and docs[done]["output"] == "Day 1: 100 sold."
    assert docs[failed]["status"] == "error" and "unreachable" in docs[failed]["tools"][0]["error"]
    # show does not hide the failed one
    capsys.readouterr()
    assert main(["show", failed, "--db", served.db]) == 0
    out = capsys.readouterr().out
    assert "status=error" in out and "sales database unreachable" in out and "day\": 1" not in out
    # the trace id alone opens the run too
    trace = failed.split("@")[1]
    assert main(["replay", trace, "--json", "--db", served.db]) == 0
    assert json.loads(capsys.readouterr().out)["ref"] == failed


def test_diff_takes_refs_and_refuses_the_bare_id(served, refs, capsys):
    done, failed = refs
    capsys.readouterr()
    assert main(["diff", done, failed, "--json", "--db", served.db]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["diverged"] and (doc["ref_a"], doc["ref_b"]) == (done, failed)
    assert main(["diff", "nightly-report", failed, "--db", served.db]) == 2
    assert "RUN_ID@TRACE_ID" in capsys.readouterr().err


def test_the_api_raises_ambiguous_with_candidates(served, refs):
    with otel_agenttape.open(served.db) as tapes:
        with pytest.raises(otel_agenttape.AmbiguousRunError) as info:
            tapes.replay("nightly-report")
        assert sorted(info.value.candidates) == sorted(refs)
        assert info.value.candidates[0] == refs[1]  # newest first
        with pytest.raises(otel_agenttape.RunNotFound):
            tapes.run("no-such-run")
        assert [r.ref for r in tapes.session("day-2")] == [refs[1]]
    # the running server itself, by URL and by its discovery file
    for source in (served.url, served.db + ".serve.json"):
        with otel_agenttape.open(source) as tapes:
            assert sorted(r.ref for r in tapes.runs(agent="nightly").runs) == sorted(refs)
            assert tapes.replay(refs[0])["tools"][0]["arguments"] == {"day": 1}
