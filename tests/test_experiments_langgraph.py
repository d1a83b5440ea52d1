"""A LangGraph program (a ReAct agent over ``ChatOpenAI``) recorded against a fake OpenAI-compatible server,
then re-run as a program-level experiment with another server as the candidate and its tools served from
the tape: no tool runs again (counted); a diverging call fails under ``tools="tape"`` and runs the real
tool, once, under ``tools="live"``."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from experiment_fakes import ChatServer  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from tape_agents import flush, recorder, start_server  # noqa: E402
from test_experiments import different, same  # noqa: E402

import otel_agenttape  # noqa: E402
from otel_agenttape.integrations.langchain import AgentTapeCallbackHandler  # noqa: E402
from otel_agenttape.integrations.langchain_experiment import served_tools  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent  # noqa: E402

CALLS: list[dict] = []  # every real call of the tool, recording and experiments alike


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    CALLS.append({"city": city})
    return json.dumps({"city": city, "temp": {"Oslo": 31}.get(city, 60)})


def ask(tape, base_url: str, model: str, messages, tools) -> str:
    """The user's program: a ReAct graph, recorded by the callback handler."""
    llm = ChatOpenAI(model=model, base_url=base_url, api_key="test", max_retries=0, temperature=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(llm, tools, name="weather_graph")
    out = agent.invoke({"messages": messages}, config={"callbacks": [AgentTapeCallbackHandler(tape)],
                                                       "metadata": {"agenttape.run.id": "lg-oslo"}})
    return out["messages"][-1].content


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("lg-exp")
    db = str(root / "tape.duckdb")
    server = start_server(db)
    with ChatServer(same) as a, ChatServer(different) as b:
        tape = recorder(server)
        try:
            answer = ask(tape, a.base_url, "fake-1", [{"role": "user", "content": "Weather in Oslo?"}], [get_weather])
            flush(tape, server)
        finally:
            tape.shutdown()
        assert answer == "In Oslo it is 31F." and CALLS == [{"city": "Oslo"}]
        with otel_agenttape.open(db) as tapes:
            ref = tapes.locate("lg-oslo")
        yield {"db": db, "server": server, "root": root, "a": a, "b": b, "ref": ref}
    server.stop()


def _exp(env, name, fake, **kw):
    def program(ctx):
        return ask(ctx.tape, fake.base_url, ctx.model, ctx.messages, served_tools([get_weather], ctx.tools))

    result = otel_agenttape.experiment(name, [env["ref"]], program, source=env["db"], model=f"cand-{name}",
                                       base_url=fake.base_url, endpoint=env["server"].url,
                                       journal=env["root"] / f"{name}.sqlite", seal=False, **kw)
    assert env["server"].wait_idle(30)
    return result


def test_graph_rerun_with_tools_from_the_tape_calls_no_tool(env):
    before, sent = len(CALLS), len(env["a"].requests)
    result = _exp(env, "lg-same", env["a"])
    assert (result.answered, result.failed) == (1, 0), result.to_json()
    row = result.runs[0]
    assert (row["tools_served"], row["tools_live"], row["diverged"]) == (1, 0, [])
    assert len(CALLS) == before  # the tool did not run again
    assert len(env["a"].requests) == sent + 2  # the candidate was asked twice: the tool call, the answer
    assert env["a"].requests[-1]["model"] == "cand-lg-same"
    assert json.loads(env["a"].requests[-1]["messages"][-1]["content"]) == {"city": "Oslo", "temp": 31}
    with otel_agenttape.open(env["db"]) as tapes:
        (mine,) = tapes.experiment_runs("lg-same")
        (graph,) = tapes.tree(mine.ref)["children"]  # the graph's run, under the experiment's run
        assert graph["agent"] == "weather_graph" and graph["tools"] == ["get_weather"] and graph["model_calls"] == 2
        s = tapes.compare("lg-same").summary()
    assert (s["runs"], s["errors"], s["answer_same"], s["tool_agreement"]) == (1, 0, 1.0, 1.0)


def test_a_diverging_call_fails_from_the_tape_and_runs_the_real_tool_only_when_live(env):
    before = len(CALLS)
    failed = _exp(env, "lg-tape", env["b"])  # this candidate asks for "oslo": not on the tape
    assert failed.failed == 1 and "ToolDivergedError" in failed.runs[0]["error"] and '"oslo"' in failed.runs[0]["error"]
    assert len(CALLS) == before
    live = _exp(env, "lg-live", env["b"], tools="live")
    assert live.failed == 0 and live.runs[0]["tools_live"] == 1
    assert CALLS[before:] == [{"city": "oslo"}]  # only the diverging call ran, through the real tool
    with otel_agenttape.open(env["db"]) as tapes:
        assert tapes.compare("lg-tape").summary()["errors"] == 1
        s = tapes.compare("lg-live").summary()
    assert s["errors"] == 0 and s["tool_agreement"] == 0.0 and s["answer_same"] == 0.0
