"""The OpenAI Agents SDK, run offline with a fake ``Model``, recorded through a real ``agenttape serve``
by ``AgentTapeProcessor``: the runs, the tree, the tool calls and the seal; and resume after a crash."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agents")

from agents import Runner, set_trace_processors, set_tracing_disabled, trace  # noqa: E402
from agents.tracing import get_trace_provider  # noqa: E402

import otel_agenttape  # noqa: E402
from integrations_agents_app import trip_agents  # noqa: E402
from integrations_support import cli, cli_json, serve, tree_runs  # noqa: E402
from otel_agenttape.integrations.openai_agents import AgentTapeProcessor, instrument_openai_agents  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture()
def sdk_tracing():
    """Tracing on, with only the processors a test sets: the SDK's uploader is never registered."""
    set_tracing_disabled(False)
    yield
    set_trace_processors([])
    set_tracing_disabled(True)


def _run_trip(tape) -> str:
    planner, _ = trip_agents()

    async def go() -> str:
        with trace("trip", group_id="sess-lyon", metadata={"agenttape.run.id": "trip-1"}):
            return (await Runner.run(planner, "Plan a day in Lyon")).final_output

    return asyncio.run(go())


def test_instrument_replaces_the_sdk_uploader(sdk_tracing):
    tape = otel_agenttape.setup(exporter=False)
    processor = instrument_openai_agents(tape)
    processors = get_trace_provider()._multi_processor._processors
    assert list(processors) == [processor]  # the default BatchTraceProcessor (its uploader) is gone
    tape.shutdown()


def test_agents_sdk_run_is_a_sealed_tape_with_child_runs(tmp_path, capsys, sdk_tracing):
    with serve(str(tmp_path / "agents.duckdb")) as srv:
        tape = otel_agenttape.setup(srv.url, service_name="trip-planner")
        set_trace_processors([AgentTapeProcessor(tape)])
        assert _run_trip(tape) == "Booked Le Bouchon at 12:30."
        tape.shutdown()
        assert tape.stats()["listener_errors"] == 0
        srv.wait_stored(10)

        runs = {r["agent"]: r for r in cli_json(capsys, "runs", "--db", srv.db)}
        assert set(runs) == {"planner", "researcher", "booker"}
        assert runs["planner"]["run_id"] == "trip-1"
        assert {r["session_id"] for r in runs.values()} == {"sess-lyon"}
        assert {r["status"] for r in runs.values()} == {"completed"}
        assert (runs["planner"]["model_calls"], runs["planner"]["tool_calls"]) == (2, 3)
        assert {r["source"] for r in runs.values()} == {"agenttape"}  # our sealed spans, from the SDK's
        assert runs["researcher"]["parent_ref"] == runs["booker"]["parent_ref"] == runs["planner"]["ref"]
        code, out = cli(capsys, "sql", "SELECT DISTINCT attributes['agenttape.framework'] AS f FROM spans "
                                       "WHERE node_type = 'run'", "--json", "--db", srv.db)
        assert code == 0 and len(json.loads(out)) == 1 and "openai-agents" in json.loads(out)[0]["f"]

        doc = cli_json(capsys, "replay", "trip-1", "--tree", "--db", srv.db)
        assert doc["agent"] == "planner" and doc["status"] == "completed"
        assert [(m["role"], m["content"]) for m in doc["input"]] == [
            ("system", "You plan trips."), ("user", "Plan a day in Lyon")]
        assert doc["output"] == "Booked Le Bouchon at 12:30."  # the answer of the agent it handed off to
        assert [(t["name"], t["arguments"], t.get("id")) for t in doc["tools"]] == [
            ("get_weather", {"city": "Lyon"}, "call_w"),
            ("research", {"input": "old town of Lyon"}, "call_r"),
            ("transfer_to_booker", {}, "call_h"),
        ]
        assert doc["tools"][0]["result"] == {"city": "Lyon", "temp": 57}
        assert doc["tools"][1]["result"] == "Vieux Lyon is lovely."
        children = {c["agent"]: c for c in doc["children"]}
        assert set(children) == {"researcher", "booker"}  # an agent used as a tool, and a handoff
        assert children["researcher"]["input"][-1] == {"role": "user", "content": "old town of Lyon"}
        assert children["researcher"]["output"] == "Vieux Lyon is lovely."
        assert children["booker"]["output"] == "Booked Le Bouchon at 12:30."
        assert all(c["parent_run_id"] == "trip-1" for c in children.values())
        assert len({r["trace_id"] for r in tree_runs(doc)}) == 1
        assert doc["models"] == ["fake-planner"]

        # the guardrail is on the planner's run span
        code, out = cli(capsys, "sql", "SELECT e.attributes FROM span_events e JOIN spans s USING (trace_id, span_id) "
                                       "WHERE e.name = 'agenttape.metadata' AND s.run_id = 'trip-1'", "--json",
                        "--db", srv.db)
        assert code == 0 and "polite" in out

        code, out = cli(capsys, "verify", "--db", srv.db)
        assert code == 0, out
        assert "trip-1" in out


def test_a_failing_tool_and_a_tripped_guardrail_are_errors(tmp_path, capsys, sdk_tracing):
    from agents import Agent, GuardrailFunctionOutput, InputGuardrailTripwireTriggered, function_tool, input_guardrail
    from agents.testing import assistant_message, function_call

    from integrations_agents_app import FakeChatModel

    @function_tool(failure_error_function=None)
    def flaky(city: str) -> str:
        """Always fails."""
        raise RuntimeError(f"no data for {city}")

    @input_guardrail
    async def no_spam(ctx, agent, user_input) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info="spam", tripwire_triggered="spam" in str(user_input))

    with serve(str(tmp_path / "errors.duckdb")) as srv:
        tape = otel_agenttape.setup(srv.url, service_name="errors")
        set_trace_processors([AgentTapeProcessor(tape)])
        model = FakeChatModel("fake-err", [[function_call("flaky", {"city": "Oslo"}, call_id="call_f")],
                                           [assistant_message("never")]])
        agent = Agent(name="fragile", instructions="Try.", model=model, tools=[flaky], input_guardrails=[no_spam])

        async def go(question: str, run_id: str):
            with trace("t", group_id="sess-e", metadata={"agenttape.run.id": run_id}):
                return await Runner.run(agent, question)

        with pytest.raises(Exception, match="no data for Oslo"):
            asyncio.run(go("Weather in Oslo?", "fail-1"))
        with pytest.raises(InputGuardrailTripwireTriggered):
            asyncio.run(go("spam spam", "spam-1"))
        tape.shutdown()
        srv.wait_stored(4)
        runs = {r["run_id"]: r for r in cli_json(capsys, "runs", "--db", srv.db)}
        assert runs["fail-1"]["status"] == "error" and runs["spam-1"]["status"] == "error"
        doc = cli_json(capsys, "replay", "fail-1", "--db", srv.db)
        assert doc["tools"][0]["name"] == "flaky" and doc["tools"][0]["arguments"] == {"city": "Oslo"}
        assert "no data for Oslo" in doc["tools"][0]["error"]


def test_resume_after_a_crash_returns_recorded_output_and_charges_once(tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    journal = str(tmp_path / "agent.resume.sqlite")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTAPE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    app = str(HERE / "integrations_agents_app.py")
    with serve(str(tmp_path / "resume.duckdb")) as srv:
        crashed = subprocess.run([sys.executable, app, srv.url, journal, str(work), "crash"], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert crashed.returncode == 17, crashed.stderr[-2000:]
        assert (work / "charges.txt").read_text().split() == ["42"]  # charged, then died in the next model call
        assert len((work / "model_calls.txt").read_text().split()) == 2

        resumed = subprocess.run([sys.executable, app, srv.url, journal, str(work)], env=env,
                                 capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        result = json.loads(resumed.stdout.strip().splitlines()[-1])
        assert result["output"] == "Paid 42, receipt R-1."  # the receipt of the one charge
        assert (result["model_hits"], result["tool_hits"]) == (1, 1)
        assert (work / "charges.txt").read_text().split() == ["42"]  # the side effect was not repeated
        assert len((work / "model_calls.txt").read_text().split()) == 3  # only the unanswered call was paid again

        srv.wait_stored(3)
        runs = {r["run_id"]: r for r in cli_json(capsys, "runs", "--db", srv.db)}
        assert runs["pay-ok"]["status"] == "completed" and runs["pay-ok"]["agent"] == "cashier"
        doc = cli_json(capsys, "replay", "pay-ok", "--db", srv.db)
        assert doc["output"] == "Paid 42, receipt R-1."
        assert [(t["name"], t["arguments"], t["result"]) for t in doc["tools"]] == [
            ("charge", {"amount": 42}, {"charged": 42, "receipt": "R-1"})]
        code, out = cli(capsys, "sql", "SELECT count(*) AS n FROM spans WHERE run_id = 'pay-ok' AND "
                                       "attributes['agenttape.resume.replayed'] IS NOT NULL", "--json",
                        "--db", srv.db)
        assert code == 0 and json.loads(out)[0]["n"] == 1  # the replayed charge is marked on its span


def _responses_api(request):
    """A stand-in for the OpenAI Responses API (no socket): a tool call, then an answer from its output."""
    import httpx

    body = json.loads(request.content)
    done = [i for i in body["input"] if isinstance(i, dict) and i.get("type") == "function_call_output"]
    if done:
        output = [{"type": "message", "id": "msg_2", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": "It is 57F in Paris.", "annotations": []}]}]
    else:
        output = [{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                   "arguments": json.dumps({"city": "Paris"}), "status": "completed"}]
    return httpx.Response(200, json={
        "id": f"resp_{len(body['input'])}", "object": "response", "created_at": 1700000000, "status": "completed",
        "model": body["model"], "instructions": body.get("instructions"), "output": output,
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "temperature": 0.2, "top_p": 1.0,
        "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}})


def test_responses_api_model_is_recorded_from_its_response_spans(tmp_path, capsys, sdk_tracing):
    import httpx
    from agents import Agent, ModelSettings, OpenAIResponsesModel, function_tool
    from openai import AsyncOpenAI

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return json.dumps({"city": city, "temp": 57})

    client = AsyncOpenAI(api_key="sk-test", max_retries=0,
                         http_client=httpx.AsyncClient(transport=httpx.MockTransport(_responses_api)))
    agent = Agent(name="weather", instructions="You are terse.", tools=[get_weather],
                  model=OpenAIResponsesModel("gpt-test", client), model_settings=ModelSettings(temperature=0.2))
    with serve(str(tmp_path / "responses.duckdb")) as srv:
        tape = otel_agenttape.setup(srv.url, service_name="responses")
        set_trace_processors([AgentTapeProcessor(tape)])

        async def go() -> str:
            with trace("w", group_id="sess-r", metadata={"agenttape.run.id": "resp-1"}):
                return (await Runner.run(agent, "Weather in Paris?")).final_output

        assert asyncio.run(go()) == "It is 57F in Paris."
        tape.shutdown()
        srv.wait_stored(4)
        doc = cli_json(capsys, "replay", "resp-1", "--db", srv.db)
        assert [(m["role"], m["content"]) for m in doc["input"]] == [
            ("system", "You are terse."), ("user", "Weather in Paris?")]
        assert doc["output"] == "It is 57F in Paris."
        assert [(t["name"], t["arguments"], t["result"], t["id"]) for t in doc["tools"]] == [
            ("get_weather", {"city": "Paris"}, {"city": "Paris", "temp": 57}, "call_1")]
        assert doc["models"] == ["gpt-test"]
        assert (doc["usage"]["input_tokens"], doc["usage"]["output_tokens"]) == (20, 10)


def test_concurrent_runs_keep_their_own_trees(sdk_tracing):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal=False)
    set_trace_processors([AgentTapeProcessor(tape)])

    async def one(i: int) -> str:
        planner, _ = trip_agents()
        with trace(f"trip {i}", group_id=f"sess-{i}", metadata={"agenttape.run.id": f"trip-{i}"}):
            return (await Runner.run(planner, f"Plan a day in Lyon ({i})")).final_output

    async def both() -> list[str]:
        return await asyncio.gather(one(1), one(2), one(3))

    assert asyncio.run(both()) == ["Booked Le Bouchon at 12:30."] * 3
    tape.shutdown()
    assert tape.stats()["listener_errors"] == 0 and tape.stats()["open_runs"] == 0
    spans = [s for s in exporter.get_finished_spans() if s.attributes.get("agenttape.node.type")]
    for i in (1, 2, 3):
        mine = [s for s in spans if s.attributes.get("agenttape.session.id") == f"sess-{i}"]
        assert len({s.context.trace_id for s in mine}) == 1  # one trace per run, nothing crossed over
        runs = {s.attributes["agenttape.run.id"]: s for s in mine if s.attributes["agenttape.node.type"] == "run"}
        assert len(runs) == 3 and runs[f"trip-{i}"].attributes["gen_ai.agent.name"] == "planner"
        children = [r for r in runs.values() if r.attributes.get("agenttape.parent_run.id") == f"trip-{i}"]
        assert sorted(r.attributes["gen_ai.agent.name"] for r in children) == ["booker", "researcher"]
        tools = [s for s in mine if s.attributes["agenttape.node.type"] == "tool"]
        assert sorted(s.attributes["gen_ai.tool.call.id"] for s in tools) == ["call_h", "call_r", "call_w"]
