"""`agenttape show | replay | diff | dataset` on stores recorded through the real receiver, and on OTLP files."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import subprocess
import sys

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agenttape
from otel_agenttape.cli import main
from tape_agents import ScriptedModel, ScriptedTools, flush, recorder, start_server, weather_agent

# the console script `agenttape` runs exactly this
AGENTTAPE = [sys.executable, "-c", "import sys; from otel_agenttape.cli import main; sys.exit(main())"]
REPLAY_KEYS = {"run_id", "status", "agent", "input", "output", "tools", "children"}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """A store with a coordinator + 2 children, two comparable runs, and runs to skip in a dataset."""
    path = str(tmp_path_factory.mktemp("cli") / "tape.duckdb")
    server = start_server(path)
    tape = recorder(server)
    try:
        with tape.run("coordinator", run_id="coord", input="Two cities") as coord:
            for city in ("Paris", "Oslo"):
                weather_agent(tape, ScriptedModel(), ScriptedTools(), f"Weather in {city}?", parent=coord,
                              run_id=f"kid-{city}")
            coord.set_output("done")
        weather_agent(tape, ScriptedModel(), ScriptedTools(), "Weather in Rome?", run_id="rome-a")
        weather_agent(tape, ScriptedModel(answer_prefix="Over in"), ScriptedTools(), "Weather in Rome?",
                      run_id="rome-b")
        with pytest.raises(RuntimeError):
            weather_agent(tape, ScriptedModel(), ScriptedTools(fail=True), "Weather in Lima?", run_id="broken")
        with tape.run("silent", run_id="silent", input="hello"):
            pass
        with pytest.raises(asyncio.CancelledError):
            with tape.run("stopped", run_id="stopped", input="hello") as run:
                run.set_output("half")
                raise asyncio.CancelledError()
        with tape.run("mute", run_id="no-input") as run:  # no input recorded anywhere
            run.set_output("an answer to nothing")

        def crash() -> None:  # a run whose process died: entered, never ended
            run = tape.run("crasher", run_id="crashed", input="hello").__enter__()
            with run.model_call(model="m", messages=[{"role": "user", "content": "hello"}]) as call:
                call.finish(text="half an answer")

        contextvars.copy_context().run(crash)
        flush(tape, server)
    finally:
        tape.shutdown()
        server.stop()
    return path


def _json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_replay_json_contract(db, capsys):
    code, doc = _json(capsys, ["replay", "rome-a", "--db", db, "--json"])
    assert code == 0
    assert REPLAY_KEYS <= set(doc)
    assert doc["run_id"] == "rome-a" and doc["status"] == "completed" and doc["agent"] == "weather"
    assert doc["input"] == [{"role": "system", "content": "You are a terse travel assistant."},
                            {"role": "user", "content": "Weather in Rome?"}]
    assert doc["output"] == "In Rome it is 70F."
    assert doc["tools"] == [{"name": "get_weather", "arguments": {"city": "Rome"},
                             "result": {"city": "Rome", "temp": 70}, "id": "call_1"}]
    assert doc["children"] == []


def test_replay_tree_json(db, capsys):
    code, doc = _json(capsys, ["replay", "coord", "--tree", "--db", db, "--json"])
    assert code == 0
    assert [c["run_id"] for c in doc["children"]] == ["kid-Paris", "kid-Oslo"]
    assert all(REPLAY_KEYS <= set(c) for c in doc["children"])
    assert doc["children"][1]["output"] == "In Oslo it is 31F."
    assert doc["children"][0]["parent_run_id"] == "coord"


def test_replay_via_console_script_and_unknown_run(db):
    proc = subprocess.run([*AGENTTAPE, "replay", "rome-b", "--db", db, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["output"] == "Over in Rome it is 70F."
    proc = subprocess.run([*AGENTTAPE, "replay", "nope", "--db", db],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "run not found: nope" in proc.stderr


def test_show_prints_ordered_steps(db, capsys):
    assert main(["show", "broken", "--db", db]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "status=error" in lines[0]
    assert any("tool-result get_weather -> ERROR" in line for line in lines)
    assert "terminal   error" in lines[-1]
    code, doc = _json(capsys, ["show", "rome-a", "--db", db, "--json"])
    assert [s["index"] for s in doc["steps"]] == list(range(len(doc["steps"])))
    assert doc["steps"][0]["kind"] == "input" and doc["steps"][-1]["kind"] == "terminal"


def test_diff_finds_first_divergent_node(db, capsys):
    code, doc = _json(capsys, ["diff", "rome-a", "rome-b", "--db", db, "--json"])
    assert code == 1 and doc["diverged"]
    first = doc["first_divergence"]
    assert first["index"] == 2  # model, tool, then the answering model call differs
    assert first["fields"] == ["output"]
    assert first["a"]["output"] == "In Rome it is 70F." and first["b"]["output"] == "Over in Rome it is 70F."
    assert main(["diff", "rome-a", "rome-a", "--db", db]) == 0
    assert "match" in capsys.readouterr().out


def test_dataset_export_counts_skips(db, tmp_path, capsys):
    out = tmp_path / "train.jsonl"
    assert main(["dataset", str(out), "--db", db, "--json"]) == 0
    printed = capsys.readouterr().out.splitlines()
    counts = json.loads(printed[-1])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # coordinator (input -> output), 2 children, rome-a, rome-b; "broken" failed, "silent" said nothing
    assert counts["written"] == len(lines) == 5
    assert counts["skipped"] == {"status=error": 1, "no_output": 1, "status=cancelled": 1,
                                 "status=incomplete": 1, "no_input": 1}
    assert "skipped 1 no_input, 1 no_output, 1 status=cancelled, 1 status=error, 1 status=incomplete" in printed[0]
    assert lines[0] == {"messages": [{"role": "user", "content": "Two cities"},
                                     {"role": "assistant", "content": "done"}]}
    ex = lines[1]
    assert [m["role"] for m in ex["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    call = ex["messages"][2]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert ex["messages"][3]["tool_call_id"] == call["id"]
    assert ex["messages"][4]["content"] == "In Paris it is 57F."
    assert ex["tools"][0]["function"]["name"] == "get_weather"
    # filters
    assert main(["dataset", str(out), "--db", db, "--agent", "nobody"]) == 0
    assert out.read_text() == ""
    assert main(["dataset", str(out), "--db", db, "--model", "fake-1", "--since", "2000-01-01"]) == 0
    assert len(out.read_text().splitlines()) == 4  # the coordinator called no model
    assert main(["dataset", str(out), "--db", db, "--agent", "coordinator"]) == 0
    assert len(out.read_text().splitlines()) == 1
    assert main(["dataset", str(out), "--db", db, "--since", "2999-01-01"]) == 0
    assert out.read_text() == ""
    capsys.readouterr()
    assert main(["dataset", str(out), "--db", db, "--since", "yesterday"]) == 2


def test_replay_from_otlp_file(tmp_path, capsys):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tape = otel_agenttape.instrument(provider, exporter=False)
    weather_agent(tape, ScriptedModel(), ScriptedTools(), "Weather in Oslo?", run_id="from-file")
    path = tmp_path / "traces.pb"
    path.write_bytes(encode_spans(exporter.get_finished_spans()).SerializeToString())
    code, doc = _json(capsys, ["replay", "from-file", "--otlp", str(path), "--json"])
    assert code == 0 and doc["output"] == "In Oslo it is 31F."
    assert main(["replay", "from-file", "--otlp", str(tmp_path / "missing.pb")]) == 2
    assert not os.path.exists(tmp_path / "agenttape.duckdb")
