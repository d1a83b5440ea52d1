"""Node replay and cassettes on runs recorded through the real receiver; the pytest plugin in a real pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import openai
import pytest
from tape_agents import (
    ScriptedModel,
    ScriptedTools,
    flush,
    recorder,
    start_server,
    weather_agent,
)
from tape_fakeopenai import FakeOpenAI

import otel_agenttape
from otel_agenttape.resume.errors import DivergenceError, UnrecordedCallError
from otel_agenttape.tape import (
    Cassette,
    RecordedToolError,
    ReplayModelClient,
    ReplayToolExecutor,
    reconstruct,
    replay_model_live,
    replay_model_mock,
    replay_tool_live,
)
from otel_agenttape.tape.replay import recorded_failure

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("replay") / "tape.duckdb")
    server = start_server(path)
    tape = recorder(server)
    try:
        weather_agent(tape, ScriptedModel(), ScriptedTools(), "Weather in Paris?", run_id="paris")
        with pytest.raises(RuntimeError):
            weather_agent(tape, ScriptedModel(), ScriptedTools(fail=True), "Weather in Oslo?", run_id="oslo-fail")
        flush(tape, server)
    finally:
        tape.shutdown()
        server.stop()
    return path


@pytest.fixture(scope="module")
def run(db):
    from otel_agenttape.store.reader import open_reader

    with open_reader(db) as reader:
        return reconstruct(reader, "paris")


def test_model_mock_prefers_raw_payload_and_falls_back_to_text(run):
    first, second = run.model_nodes
    result = replay_model_mock(first)
    assert result.raw["id"] == "resp_1" and result.output is result.raw
    assert result.deltas == ["Check", "ing."] and result.text == "Checking."
    assert result.tool_calls == [{"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}]
    second.raw_output = None
    assert replay_model_mock(second).output == "In Paris it is 57F."


def test_wrong_node_type_raises_value_error(run):
    model, tool = run.model_nodes[0], run.tool_nodes[0]
    with pytest.raises(ValueError):
        replay_model_mock(tool)
    with pytest.raises(ValueError):
        replay_model_live(tool, lambda request: "x")
    with pytest.raises(ValueError):
        replay_tool_live(model, lambda call: None)


def test_tool_live_rebinds_the_tool(run):
    seen = []

    def rebound(call):
        seen.append((call.name, call.arguments, call.call_id))
        return {"city": call.arguments["city"], "temp": 99}

    out = replay_tool_live(run.tool_nodes[0], rebound)
    assert seen == [("get_weather", {"city": "Paris"}, "call_1")]
    assert out.result == {"city": "Paris", "temp": 99} and out.executed


def test_model_live_sends_recorded_prompt_to_a_real_client(run):
    with FakeOpenAI() as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
        result = replay_model_live(run.model_nodes[1], client)
    sent = fake.requests[0]
    assert sent["model"] == "fake-1"
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert sent["messages"][2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert sent["messages"][3]["tool_call_id"] == "call_1"
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert result.text == "It is 57F in Paris." and result.raw["id"] == "chatcmpl-1"


def test_cassette_reruns_the_agent_offline_with_identical_output(db, run):
    tools = ScriptedTools()
    cassette = Cassette.from_store(db, "paris")
    offline = otel_agenttape.setup(exporter=False, memory=True)
    out = weather_agent(offline, cassette.model, cassette.tools, "Weather in Paris?")
    assert out == run.output == cassette.output
    assert tools.log == []
    cassette.assert_consumed()
    # the offline re-run records the same node records as the original run
    records = offline.memory.records()
    assert [r.output_text for r in records if r.node_type == "model"] == ["Checking.", "In Paris it is 57F."]
    offline.shutdown()


def test_cassette_streams_recorded_deltas_in_order(db):
    client = ReplayModelClient.from_store(db, "paris", check_requests=False)
    stream = client.stream()
    assert list(stream) == ["Check", "ing."] and stream.result.text == "Checking."
    assert list(client.stream()) == ["In ", "Paris ", "it ", "is ", "57F."]
    with pytest.raises(UnrecordedCallError):
        client.create({"messages": [{"role": "user", "content": "again"}]})


def test_divergent_request_fails_with_a_diff(db):
    cassette = Cassette.from_store(db, "paris")
    with pytest.raises(DivergenceError) as err:
        weather_agent(otel_agenttape.setup(exporter=False), cassette.model, cassette.tools, "Weather in Rome?")
    diff = err.value.diff
    assert '-      "content": "Weather in Paris?",' in diff and '+      "content": "Weather in Rome?",' in diff
    tools = ReplayToolExecutor.from_store(db, "paris")
    with pytest.raises(DivergenceError) as err:
        tools.execute("get_weather", {"city": "Rome"})
    assert '"city": "Paris"' in err.value.diff and '"city": "Rome"' in err.value.diff
    assert tools.execute("get_weather", {"city": "Paris"}) == {"city": "Paris", "temp": 57}
    with pytest.raises(UnrecordedCallError):
        tools.execute("get_weather", {"city": "Paris"})


def test_recorded_tool_failure_replays_as_failure(db):
    tools = ReplayToolExecutor.from_store(db, "oslo-fail")
    with pytest.raises(RuntimeError) as err:
        tools.execute("get_weather", {"city": "Oslo"})
    # the same type and message as the tool raised, so the agent reports the same text to its model
    assert type(err.value) is RuntimeError and str(err.value) == "weather service down"
    custom = recorded_failure("t", "QuotaExceeded: 5 per minute")
    assert isinstance(custom, RecordedToolError) and type(custom).__name__ == "QuotaExceeded"
    assert str(custom) == "5 per minute"


def test_pytest_plugin_marker_and_fixture(db, tmp_path):
    test_file = tmp_path / "test_recorded.py"
    test_file.write_text(textwrap.dedent(f"""
        import pytest
        import otel_agenttape
        from tape_agents import weather_agent

        @pytest.mark.agenttape_cassette("paris", db={db!r})
        def test_same_answer(agenttape_cassette):
            tape = otel_agenttape.setup(exporter=False)
            out = weather_agent(tape, agenttape_cassette.model, agenttape_cassette.tools, "Weather in Paris?")
            assert out == agenttape_cassette.output

        @pytest.mark.agenttape_cassette("paris", db={db!r})
        def test_shorter_path_fails_strict(agenttape_cassette):
            agenttape_cassette.model.create(None)

        @pytest.mark.agenttape_cassette("paris")
        def test_db_from_option(agenttape_cassette):
            assert agenttape_cassette.run.run_id == "paris"
            agenttape_cassette.model.position = 2
            agenttape_cassette.tools.execute("get_weather", {{"city": "Paris"}})
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:agenttape",
         "-p", "otel_agenttape.tape.pytest_plugin", "--agenttape-db", db, str(test_file)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    out = proc.stdout
    # the shorter path passes its body and errors at teardown (strict)
    assert "3 passed, 1 error" in out, out
    assert "ERROR test_recorded.py::test_shorter_path_fails_strict" in out
    assert "1 recorded model call(s) were not replayed" in out


def test_demo_agents_rerun_offline_from_a_tree_cassette(tmp_path):
    """The demo (a coordinator and two specialists, streamed output, a retried model call, parallel
    tools, a failing tool) recorded through the receiver, then re-run offline from the tape."""
    from otel_agenttape.demo import run_demo_agents

    server = start_server(str(tmp_path / "demo.duckdb"))
    tape = recorder(server)
    try:
        recorded = run_demo_agents(tape)
        flush(tape, server)
        cassette = Cassette.from_store(server.store.reader(), recorded["run_id"], tree=True)
    finally:
        tape.shutdown()
        server.stop()
    assert [c.agent for c in cassette.run.children] == ["researcher", "critic"]
    offline = otel_agenttape.setup(exporter=False)
    replayed = run_demo_agents(offline, model=cassette.model, tools=cassette.tools)
    offline.shutdown()
    assert replayed["outputs"] == recorded["outputs"]
    cassette.assert_consumed()
