"""Program-level experiments: a recorded coordinator with two specialists re-run with a candidate model
live and tools from the tape (no tool runs again: counted); a diverging tool call under each policy."""

from __future__ import annotations

import json

import pytest
from experiment_fakes import ChatServer
from tape_agents import MODEL, ScriptedModel, ScriptedTools, flush, recorder, start_server, weather_agent
from test_experiments import different, same

import otel_agenttape
from otel_agenttape.tape.replay import result_from_response


class LiveModel:
    """The candidate behind the ``model.stream(request)`` interface the recorded agent uses."""

    def __init__(self, ctx):
        self.ctx = ctx

    def stream(self, request):
        messages = [{"role": "system", "content": request["system"]}, *request["messages"]]
        response = self.ctx.client.chat.completions.create(model=self.ctx.model, messages=messages,
                                                           tools=request["tools"])
        result = result_from_response(response)
        result.deltas = [result.text] if result.text else []

        class Stream(list):
            pass

        stream = Stream(result.deltas)
        stream.result = result
        return stream


def team(tape, model, tools, question):
    """A coordinator that hands each city to a weather specialist (a child run)."""
    with tape.run("coordinator", input=question) as run:
        answers = [weather_agent(tape, model, tools, f"Weather in {c}?", parent=run)
                   for c in question.split(" and ")]
        run.set_output(" ".join(answers))
        return run.output


def program(ctx):
    return team(ctx.tape, LiveModel(ctx), ctx.tools, ctx.input)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("program")
    db = str(root / "tape.duckdb")
    server = start_server(db)
    tape = recorder(server)
    real = ScriptedTools()
    try:
        team(tape, ScriptedModel(), real, "Paris and Oslo")
        flush(tape, server)
    finally:
        tape.shutdown()
    with otel_agenttape.open(db) as tapes:
        ref = next(r.ref for r in tapes.runs().runs if r.agent == "coordinator")
    with ChatServer(same) as a, ChatServer(different) as b:
        yield {"db": db, "server": server, "root": root, "a": a, "b": b, "ref": ref, "recorded_calls": len(real.log)}
    server.stop()


def _exp(env, name, fake, **kw):
    result = otel_agenttape.experiment(name, [env["ref"]], program, source=env["db"], model=f"cand-{name}",
                                       base_url=fake.base_url, endpoint=env["server"].url,
                                       journal=env["root"] / f"{name}.sqlite", seal=False, **kw)
    assert env["server"].wait_idle(30)
    return result


def test_team_rerun_with_tools_from_the_tape_runs_no_tool(env):
    assert env["recorded_calls"] == 2
    result = _exp(env, "prog-a", env["a"])
    row = result.runs[0]
    assert (result.answered, result.failed) == (1, 0)
    assert (row["tools_served"], row["tools_live"], row["tools_mocked"], row["diverged"]) == (2, 0, 0, [])
    assert len(env["a"].requests) == 4  # two model calls per specialist, all to the candidate
    with otel_agenttape.open(env["db"]) as tapes:
        (mine,) = tapes.experiment_runs("prog-a")
        tree = tapes.tree(mine.ref)
        (coordinator,) = tree["children"]  # the program's own runs, under the experiment's run
        assert [c["agent"] for c in coordinator["children"]] == ["weather", "weather"]
        s = tapes.compare("prog-a").summary()
        assert s["answer_same"] == 1.0 and s["runs"] == 1
    again = _exp(env, "prog-a", env["a"])
    assert (again.skipped, again.answered) == (1, 0) and len(env["a"].requests) == 4


def test_diverging_tool_call_per_policy(env):
    failed = _exp(env, "prog-tape", env["b"])
    assert failed.failed == 1 and "ToolDivergedError" in failed.runs[0]["error"]
    assert "get_weather" in failed.runs[0]["error"] and '"oslo"' in failed.runs[0]["error"]
    assert failed.runs[0]["tools_served"] == 1  # Paris matched the tape
    with otel_agenttape.open(env["db"]) as tapes:
        assert tapes.compare("prog-tape").summary()["errors"] == 1
    mocked = _exp(env, "prog-mock", env["b"], tools="mock", mock=lambda name, args: {"city": args["city"], "temp": 1})
    assert mocked.failed == 0 and mocked.runs[0]["tools_mocked"] == 1 and mocked.runs[0]["tools_served"] == 1
    real = ScriptedTools()
    live = _exp(env, "prog-live", env["b"], tools="live", live={"get_weather": lambda city: real.execute(
        "get_weather", {"city": city})})
    assert live.failed == 0 and real.log == [("get_weather", {"city": "oslo"})]  # only the diverging call ran
    with otel_agenttape.open(env["db"]) as tapes:
        cmp = tapes.compare("prog-live")
        assert cmp.summary()["answer_same"] == 0.0 and cmp.pairs[0].candidate.output_text == "Paris: 57F oslo: 60F"
    with pytest.raises(ValueError, match="mock"):
        _exp(env, "prog-bad", env["b"], tools="mock")
