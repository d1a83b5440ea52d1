"""Runs from every source through a real ``agenttape serve``: the real ``openai`` client under each
installed instrumentation (OTel GenAI, OpenInference, OpenLLMetry) against a fake OpenAI server on
127.0.0.1, with and without an agent span; plus our own demo. ``agenttape runs`` lists each with the
right agent, session, source and status, and every ref it prints opens in ``show`` and ``replay``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from otel_agenttape.cli import main
from read_support import HERE, Served, wait_for
from tape_fakeopenai import FakeOpenAI

WEATHER = {"city": "Paris", "temp": 57}
CONVENTIONS = {
    "genai": ("opentelemetry.instrumentation.genai.openai", "otel-genai", "conv-genai"),
    "genai-events": ("opentelemetry.instrumentation.genai.openai", "otel-genai", "conv-genai-events"),
    "openinference": ("openinference.instrumentation.openai", "openinference", "sess-openinference"),
    "openllmetry": ("opentelemetry.instrumentation.openai", "openllmetry", "sess-openllmetry"),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("openai")
    server = Served(str(tmp_path_factory.mktemp("sources") / "tapes.duckdb"))
    traces: dict[tuple[str, str], str] = {}
    try:
        with FakeOpenAI() as fake:
            procs = {}
            for convention, (module, _, _) in CONVENTIONS.items():
                try:
                    __import__(module)
                except ImportError:
                    continue
                for mode in ("agent", "bare"):  # independent processes (own trace, own session): at once
                    procs[(convention, mode)] = subprocess.Popen(
                        [sys.executable, str(HERE / "tape_foreign_app.py"), convention, server.url, fake.base_url,
                         "agent" if mode == "agent" else ""],
                        env=server.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for key, proc in procs.items():
                out, err = proc.communicate(timeout=180)
                assert proc.returncode == 0, err[-3000:]
                traces[key] = out.strip().splitlines()[-1]
        server.traces = traces
        yield server
    finally:
        server.stop()


def _listed(served, capsys, *flags):
    capsys.readouterr()
    assert main(["runs", "--db", served.db, "--json", "--limit", "100", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def _stored(served, capsys, trace_id):
    return wait_for(lambda: [r for r in _listed(served, capsys) if r["trace_id"] == trace_id
                             and r["model_calls"] == 2])


@pytest.mark.parametrize("convention", list(CONVENTIONS))
@pytest.mark.parametrize("mode", ["agent", "bare"])
def test_each_instrumentation_is_listed_and_opens(served, capsys, convention, mode):
    if (convention, mode) not in served.traces:
        pytest.skip(f"{CONVENTIONS[convention][0]} is not installed")
    trace_id = served.traces[(convention, mode)]
    _, source, session = CONVENTIONS[convention]
    rows = _stored(served, capsys, trace_id)
    assert len(rows) == 1, rows  # one run per trace, never a run per model call
    run = rows[0]
    assert (run["source"], run["status"], run["tool_calls"] + run["model_calls"]) == (source, "completed", 2)
    if mode == "agent":
        assert (run["agent"], run["session_id"]) == ("weather", session)
        assert run["run_id"] == run["span_id"] and run["ref"] == f"{run['span_id']}@{trace_id}"
    else:  # no agent span: the trace is the run, named by its service
        assert (run["run_id"], run["agent"]) == (trace_id, f"foreign-{convention}")
    assert run["models"] == ["gpt-test"] and run["input_tokens"] > 0
    # filters find it
    assert [r["ref"] for r in _listed(served, capsys, "--source", source, "--agent", run["agent"])
            if r["trace_id"] == trace_id] == [run["ref"]]
    if mode == "agent":
        assert [r["ref"] for r in _listed(served, capsys, "--session", session)] == [run["ref"]]
    # the listed ref opens, with the same agent and session, the prompt, the answer and the tool call
    capsys.readouterr()
    assert main(["replay", run["ref"], "--json", "--db", served.db]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ref"], doc["agent"], doc["session_id"], doc["source"]) == (
        run["ref"], run["agent"], run["session_id"], source)
    assert (doc["usage"]["input_tokens"], doc["usage"]["output_tokens"]) == (run["input_tokens"], run["output_tokens"])
    assert doc["output"] == "It is 57F in Paris."
    assert [m["content"] for m in doc["input"]] == ["You are terse.", "Weather in Paris?"]
    assert [(t["name"], t["arguments"]) for t in doc["tools"]] == [("get_weather", {"city": "Paris"})]
    assert main(["show", run["ref"], "--db", served.db]) == 0
    shown = capsys.readouterr().out
    assert f"run {run['ref']}" in shown and "terminal   completed" in shown
    # and the trace id alone opens the same run
    assert main(["replay", trace_id, "--json", "--db", served.db]) == 0
    assert json.loads(capsys.readouterr().out)["ref"] == run["ref"]


def test_our_demo_lists_every_run_with_parents_and_each_ref_opens(tmp_path, capsys):
    db = str(tmp_path / "demo.duckdb")
    assert main(["demo", "--db", db, "--json"]) == 0
    capsys.readouterr()
    assert main(["runs", "--db", db]) == 0
    text = capsys.readouterr().out
    rows = _listed(type("S", (), {"db": db}), capsys)
    assert sorted(r["agent"] for r in rows) == ["coordinator", "critic", "researcher"]
    root = next(r for r in rows if r["agent"] == "coordinator")
    assert all(r["parent_ref"] == root["ref"] for r in rows if r is not root)
    assert {r["source"] for r in rows} == {"agenttape"} and all(r["session_id"] == "demo-session" for r in rows)
    capsys.readouterr()
    assert main(["runs", "--db", db, "--limit", "1"]) == 0
    assert "2 more (of 3)" in capsys.readouterr().out
    assert main(["runs", "--db", db, "--since", "2000-01-01", "--status", "completed", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    assert main(["runs", "--db", db, "--since", "2999-01-01", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["runs", "--db", db, "--since", "yesterday"]) == 2
    assert "since" in capsys.readouterr().err
    for r in rows:
        assert r["ref"] in text  # printed whole, so a copied ref opens
        capsys.readouterr()
        assert main(["show", r["ref"], "--db", db]) == 0
        assert f"run {r['ref']}" in capsys.readouterr().out
        assert main(["replay", r["ref"], "--json", "--db", db]) == 0
        assert json.loads(capsys.readouterr().out)["agent"] == r["agent"]
