"""Traces of the frameworks' own OpenTelemetry instrumentations, exported by real programs (the Agents
SDK on the fake OpenAI server, a LangGraph agent on a fake chat model) to a real ``agenttape serve``,
rebuild to runs with the prompt, the answer and the tool calls with their exact arguments."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from console_app import serve_console
from integrations_support import cli, cli_json, serve, tree_runs
from otel_agenttape.console.serve import open_tapes
from tape_fakeopenai import FakeOpenAI

HERE = Path(__file__).parent
MODULES = {
    "oi-agents": "openinference.instrumentation.openai_agents",
    "otel-agents": "opentelemetry.instrumentation.openai_agents",
    "oi-agents-trip": "openinference.instrumentation.openai_agents",
    "otel-agents-trip": "opentelemetry.instrumentation.openai_agents",
    "oi-langchain": "openinference.instrumentation.langchain",
    "otel-langchain": "opentelemetry.instrumentation.langchain",
    "oi-agents-handoff": "openinference.instrumentation.openai_agents",
    "oi-langgraph-handoff": "langchain_openai",
}
WEATHER = ("get_weather", {"city": "Paris"}, {"city": "Paris", "temp": 57})


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    with serve(str(tmp_path_factory.mktemp("foreign-fw") / "fw.duckdb")) as srv:
        yield srv


def _record(receiver, kind: str, *args: str) -> tuple[str, list[str]]:
    pytest.importorskip(MODULES[kind])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTAPE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    with FakeOpenAI() as fake:
        proc = subprocess.run([sys.executable, str(HERE / "integrations_foreign_app.py"), kind, receiver.url,
                               fake.base_url, *args], env=env, capture_output=True, text=True, timeout=180)
        requests = fake.requests
    assert proc.returncode == 0, proc.stderr[-3000:]
    receiver.wait_stored(5)
    return proc.stdout.strip().splitlines()[-1], requests


def _tools(doc: dict) -> list[tuple]:
    return [(t["name"], t["arguments"], t["result"]) for run in tree_runs(doc) for t in run["tools"]
            if t.get("ran", True)]


@pytest.mark.parametrize("kind", ["oi-agents", "otel-agents"])
def test_agents_sdk_instrumentations_rebuild_the_run(receiver, kind, capsys):
    trace_id, requests = _record(receiver, kind)
    assert len(requests) == 2  # the SDK really called the (fake) OpenAI server twice
    runs = [r for r in cli_json(capsys, "runs", "--db", receiver.db, "--source", "openai-agents")
            if r["trace_id"] == trace_id]
    assert runs and all(r["status"] == "completed" for r in runs)
    doc = cli_json(capsys, "replay", trace_id, "--tree", "--db", receiver.db)
    agents = [r for r in tree_runs(doc) if r["agent"] == "weather" and r["models"]]
    assert len(agents) == 1, [r["agent"] for r in tree_runs(doc)]
    run = agents[0]
    assert run["models"] == ["gpt-test"]
    assert ("user", "Weather in Paris?") in [(m["role"], m["content"]) for m in run["input"]]
    assert ("system", "You are terse.") in [(m["role"], m["content"]) for m in run["input"]]
    assert run["output"] == "It is 57F in Paris."
    assert _tools(doc) == [WEATHER]
    assert (run["usage"]["input_tokens"], run["usage"]["output_tokens"]) == (23, 10)


@pytest.mark.parametrize("kind", ["oi-langchain", "otel-langchain"])
def test_langchain_instrumentations_rebuild_the_tool_calls(receiver, kind, capsys):
    trace_id, _ = _record(receiver, kind)
    runs = [r for r in cli_json(capsys, "runs", "--db", receiver.db, "--source", "langgraph")
            if r["trace_id"] == trace_id]
    assert runs and all(r["status"] == "completed" for r in runs)
    assert "sess-foreign" in {r["session_id"] for r in runs}
    doc = cli_json(capsys, "replay", trace_id, "--tree", "--db", receiver.db)
    # the tool's content (not LangChain's message object) and, where the instrumentation keeps them
    # (OpenInference keeps LangChain's display string of the input), the exact arguments
    name, arguments, result = WEATHER
    assert _tools(doc) == [(name, arguments if kind == "otel-langchain" else "Paris", result)]
    ids = {t.get("id") for run in tree_runs(doc) for t in run["tools"] if t.get("ran", True)}
    assert ids == {"call_1"}


def _shape(run: dict) -> tuple:
    """What a person reads of a tree: agent, status, output, tools with arguments, children by agent."""
    # a handoff is the edge to its child run; each recorder shows the handoff's own call its way (ours
    # the SDK's transfer_to_X tool call, OpenInference a "handoff to X" tool span, OTel a handoff span)
    tools = sorted((t["name"], json.dumps(t["arguments"], sort_keys=True)) for t in run["tools"]
                   if t.get("ran", True) and not t["name"].startswith(("transfer_to_", "handoff to ")))
    kids = sorted((_shape(c) for c in run.get("children") or []), key=repr)
    return (run["agent"], run["status"], run["output"], tuple(tools), tuple(kids))


@pytest.mark.parametrize("kind", ["oi-agents-trip", "otel-agents-trip"])
def test_agents_sdk_instrumentations_rebuild_the_same_tree_as_our_processor(receiver, kind, tmp_path, capsys):
    """A handoff and an agent used as a tool are child runs, whichever records the program."""
    trace_id, _ = _record(receiver, kind)
    theirs = cli_json(capsys, "replay", trace_id, "--tree", "--db", receiver.db)

    pytest.importorskip("agents")
    from agents import Runner, set_trace_processors, set_tracing_disabled, trace

    import otel_agenttape
    from integrations_agents_app import trip_agents
    from otel_agenttape.integrations.openai_agents import AgentTapeProcessor

    with serve(str(tmp_path / "ours.duckdb")) as ours_srv:
        tape = otel_agenttape.setup(ours_srv.url, service_name="trip-ours")
        set_tracing_disabled(False)
        set_trace_processors([AgentTapeProcessor(tape)])
        try:
            planner, _ = trip_agents()

            async def go() -> None:
                with trace("trip", group_id="sess-trip", metadata={"agenttape.run.id": "trip-ours"}):
                    await Runner.run(planner, "Plan lunch in Lyon")

            asyncio.run(go())
        finally:
            set_trace_processors([])
            tape.shutdown()
        ours_srv.wait_stored(5)
        ours = cli_json(capsys, "replay", "trip-ours", "--tree", "--db", ours_srv.db)

    root = [r for r in tree_runs(theirs) if r["agent"] == "planner"]
    assert len(root) == 1, [r["agent"] for r in tree_runs(theirs)]
    listed = {r["agent"]: r for r in cli_json(capsys, "runs", "--db", receiver.db) if r["trace_id"] == trace_id}
    planner_ref = f"{listed['planner']['run_id']}@{trace_id}"
    assert listed["researcher"]["parent_ref"] == listed["booker"]["parent_ref"] == planner_ref  # as the tree
    assert {c["agent"] for c in root[0]["children"]} == {"researcher", "booker"}
    # the planner's own output differs by recorder (ours: the run's final answer, which the booker gave;
    # the instrumentations: the planner's last model message); everything else is the same tree
    assert _shape(root[0])[:2] + _shape(root[0])[3:] == _shape(ours)[:2] + _shape(ours)[3:]
    assert "Booked Le Bouchon at 12:30." in json.dumps(_shape(root[0]))


@pytest.mark.parametrize("kind", ["oi-langgraph-handoff", "oi-agents-handoff"])
def test_a_handoff_between_two_agents_shows_the_question_and_the_answer_at_its_root(receiver, kind, tmp_path,
                                                                                     capsys):
    """LangGraph's root span holds the graph's state as LangChain serialised it; the Agents SDK's workflow
    span holds nothing, so its run reads both from the model calls of the agents below it, and says so."""
    lyon, requests = _record(receiver, kind, "Weather in Lyon?")
    assert [[t["function"]["name"] for t in r["tools"]] for r in requests] == [
        ["transfer_to_specialist"], ["get_weather"], ["get_weather"]]  # triage handed over; the specialist ran
    paris, _ = _record(receiver, kind, "Weather in Paris?")
    root = cli_json(capsys, "replay", lyon, "--tree", "--db", receiver.db)
    assert [m["content"] for m in root["input"] if m["role"] == "user"] == ["Weather in Lyon?"]
    assert root["output"] == "It is 57F in Lyon."
    read_from = None if kind == "oi-langgraph-handoff" else "model_call"
    assert (root.get("input_from"), root.get("output_from")) == (read_from, read_from)

    listed = [r for r in cli_json(capsys, "runs", "--db", receiver.db) if r["trace_id"] == lyon]
    assert root["ref"] in {r["ref"] for r in listed} and all(r["status"] == "completed" for r in listed)

    code, out = cli(capsys, "diff", lyon, paris, "--db", receiver.db, "--json")
    where = json.loads(out)["first_divergence"]
    if read_from:  # the workflow's run has no model calls of its own: the two differ in their answers
        assert (where["fields"], where["a"]["output"], where["b"]["output"]) == (
            ["output"], "It is 57F in Lyon.", "It is 57F in Paris."), where
    else:  # the graph's run holds the triage call, asked another question
        assert "input" in where["fields"], where

    dataset = tmp_path / "examples.jsonl"
    cli(capsys, "dataset", "--db", receiver.db, "--agent", root["agent"], str(dataset))
    examples = [json.loads(line)["messages"] for line in dataset.read_text().splitlines()]
    asked = [e for e in examples if {"role": "user", "content": "Weather in Lyon?"} in e]
    assert len(asked) == 1, examples  # the root run is an example, not skipped for want of an input

    with serve_console(open_tapes(db=receiver.db)) as url:
        steps = httpx.get(f"{url}/api/runs/{root['ref']}/steps", timeout=60).json()["steps"]
    first, last = steps[0], steps[-1]
    assert (first["kind"], last["kind"]) == ("input", "terminal")
    assert {"role": "user", "content": "Weather in Lyon?"} in first["content"]
    assert last["output"] == "It is 57F in Lyon."
    assert (first.get("input_from"), last.get("output_from")) == (read_from, read_from)
