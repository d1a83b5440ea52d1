"""LangGraph, run offline with langchain_core's fake chat models, recorded through a real
``agenttape serve`` by ``AgentTapeCallbackHandler``: runs, graph nodes, the subgraph as a child run,
tool calls, the seal; and resume after a crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

import otel_agenttape  # noqa: E402
from integrations_langgraph_app import question, trip_graph  # noqa: E402
from integrations_support import cli, cli_json, serve  # noqa: E402
from otel_agenttape.integrations.langchain import AgentTapeCallbackHandler  # noqa: E402

HERE = Path(__file__).parent


def test_langgraph_run_is_a_sealed_tape_with_the_subgraph_as_child(tmp_path, capsys):
    with serve(str(tmp_path / "graph.duckdb")) as srv:
        tape = otel_agenttape.setup(srv.url, service_name="trip-graph")
        handler = AgentTapeCallbackHandler(tape)
        out = trip_graph().invoke(question(), config={
            "callbacks": [handler], "metadata": {"session_id": "sess-g", "agenttape.run.id": "graph-1"}})
        assert out["messages"][-1].content == "Summary: Lyon: 57F and sunny."
        tape.shutdown()
        assert tape.stats()["listener_errors"] == 0
        srv.wait_stored(8)

        runs = {r["agent"]: r for r in cli_json(capsys, "runs", "--db", srv.db)}
        assert set(runs) == {"trip_graph", "weather_agent"}
        assert runs["trip_graph"]["run_id"] == "graph-1"
        assert {r["session_id"] for r in runs.values()} == {"sess-g"}
        assert {r["status"] for r in runs.values()} == {"completed"}
        assert {r["source"] for r in runs.values()} == {"agenttape"}
        assert runs["weather_agent"]["parent_ref"] == runs["trip_graph"]["ref"]
        assert runs["weather_agent"]["tools"] == ["get_weather"]

        doc = cli_json(capsys, "replay", "graph-1", "--tree", "--db", srv.db)
        assert doc["input"] == [{"role": "user", "content": "Weather in Lyon?"}]
        assert doc["output"] == "Summary: Lyon: 57F and sunny."
        [child] = doc["children"]
        assert child["agent"] == "weather_agent" and child["parent_run_id"] == "graph-1"
        assert child["output"] == "Lyon: 57F and sunny."
        assert [(t["name"], t["arguments"], t["result"], t.get("id")) for t in child["tools"]] == [
            ("get_weather", {"city": "Lyon"}, {"city": "Lyon", "temp": 57}, "call_w")]
        assert child["input"][-1] == {"role": "user", "content": "Weather in Lyon?"}

        code, out = cli(capsys, "sql", "SELECT name, attributes['agenttape.graph.step'] AS step FROM spans "
                                       "WHERE name LIKE 'node %' ORDER BY start_time_unix_nano", "--json",
                        "--db", srv.db)
        assert code == 0
        nodes = [r["name"] for r in json.loads(out)]
        assert nodes == ["node weather", "node agent", "node tools", "node agent", "node summarize"]

        code, out = cli(capsys, "verify", "--db", srv.db)
        assert code == 0, out


def test_a_failing_tool_marks_its_node_and_a_failing_graph_its_run(tmp_path, capsys):
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    from integrations_langgraph_app import ToolCallingFake

    @tool
    def flaky(city: str) -> str:
        """Always fails."""
        raise RuntimeError(f"no data for {city}")

    model = ToolCallingFake(responses=[
        AIMessage(content="", tool_calls=[{"id": "call_f", "name": "flaky", "args": {"city": "Oslo"}}])])
    with serve(str(tmp_path / "err.duckdb")) as srv:
        tape = otel_agenttape.setup(srv.url, service_name="err-graph")
        agent = create_react_agent(model, [flaky], name="fragile")
        with pytest.raises(RuntimeError, match="no data for Oslo"):
            agent.invoke(question(), config={"callbacks": [AgentTapeCallbackHandler(tape)],
                                             "metadata": {"agenttape.run.id": "fragile-1"}})
        tape.shutdown()
        srv.wait_stored(3)
        runs = {r["run_id"]: r for r in cli_json(capsys, "runs", "--db", srv.db)}
        assert runs["fragile-1"]["status"] == "error"
        doc = cli_json(capsys, "replay", "fragile-1", "--db", srv.db)
        assert doc["tools"][0]["arguments"] == {"city": "Oslo"} and "no data for Oslo" in doc["tools"][0]["error"]


def test_resume_after_a_crash_returns_recorded_output_and_charges_once(tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    journal = str(tmp_path / "graph.resume.sqlite")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTAPE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    app = str(HERE / "integrations_langgraph_app.py")
    with serve(str(tmp_path / "resume.duckdb")) as srv:
        crashed = subprocess.run([sys.executable, app, srv.url, journal, str(work), "crash"], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert crashed.returncode == 17, crashed.stderr[-2000:]
        assert (work / "charges.txt").read_text().split() == ["42"]
        resumed = subprocess.run([sys.executable, app, srv.url, journal, str(work)], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        result = json.loads(resumed.stdout.strip().splitlines()[-1])
        assert result["output"] == "Paid 42, receipt R-1."
        assert (result["model_hits"], result["tool_hits"]) == (1, 1)
        assert (work / "charges.txt").read_text().split() == ["42"]  # not charged twice
        assert len((work / "model_calls.txt").read_text().split()) == 3

        srv.wait_stored(3)
        runs = {r["run_id"]: r for r in cli_json(capsys, "runs", "--db", srv.db)}
        assert runs["lg-pay-ok"]["status"] == "completed" and runs["lg-pay-ok"]["session_id"] == "sess-lg"
        doc = cli_json(capsys, "replay", "lg-pay-ok", "--db", srv.db)
        assert doc["output"] == "Paid 42, receipt R-1."
        assert [(t["name"], t["arguments"], t["result"]) for t in doc["tools"]] == [
            ("charge", {"amount": 42}, {"charged": 42, "receipt": "R-1"})]
