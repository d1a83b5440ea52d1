"""Traces of the frameworks' own OpenTelemetry instrumentations, exported by real programs (the Agents
SDK on the fake OpenAI server, a LangGraph agent on a fake chat model) to a real ``agenttape serve``,
rebuild to runs with the prompt, the answer and the tool calls with their exact arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from integrations_support import cli_json, serve, tree_runs
from tape_fakeopenai import FakeOpenAI

HERE = Path(__file__).parent
MODULES = {
    "oi-agents": "openinference.instrumentation.openai_agents",
    "otel-agents": "opentelemetry.instrumentation.openai_agents",
    "oi-langchain": "openinference.instrumentation.langchain",
    "otel-langchain": "opentelemetry.instrumentation.langchain",
}
WEATHER = ("get_weather", {"city": "Paris"}, {"city": "Paris", "temp": 57})


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    with serve(str(tmp_path_factory.mktemp("foreign-fw") / "fw.duckdb")) as srv:
        yield srv


def _record(receiver, kind: str) -> tuple[str, list[str]]:
    pytest.importorskip(MODULES[kind])
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTAPE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    with FakeOpenAI() as fake:
        proc = subprocess.run([sys.executable, str(HERE / "integrations_foreign_app.py"), kind, receiver.url,
                               fake.base_url], env=env, capture_output=True, text=True, timeout=180)
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
