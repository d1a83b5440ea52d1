"""``GET /api/experiments`` over one long-lived read model: each experiment's summary is kept until its
runs change, so a rerun's new runs show up on the next call and an unchanged experiment is not compared
again."""

from __future__ import annotations

import pytest
from experiment_fakes import ChatServer
from tape_agents import ScriptedModel, ScriptedTools, flush, recorder, start_server, weather_agent
from test_experiments import different, same

import otel_agenttape
from otel_agenttape.console import api
from otel_agenttape.tape import experiment_compare
from otel_agenttape.tape.experiment import Candidate, run_experiment


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("overview")
    db = str(root / "tape.duckdb")
    server = start_server(db)
    tape = recorder(server)
    try:
        for city in ("Paris", "Oslo"):
            weather_agent(tape, ScriptedModel(), ScriptedTools(), f"Weather in {city}?", run_id=city.lower())
        flush(tape, server)
    finally:
        tape.shutdown()
    with ChatServer(same) as a, ChatServer(different) as b:
        yield {"db": db, "server": server, "root": root, "a": a, "b": b}
    server.stop()


def _run(env, name, fake, refs):
    run_experiment(env["db"], name, Candidate(f"cand-{name}", base_url=fake.base_url), refs=refs,
                   endpoint=env["server"].url, journal=env["root"] / f"{name}.sqlite", seal=False)
    assert env["server"].wait_idle(30)


def test_a_new_run_shows_up_and_an_unchanged_experiment_is_not_compared_again(env, monkeypatch):
    compared: list[str] = []
    real = experiment_compare.compare

    def counting(tapes, name, **kw):
        compared.append(name)
        return real(tapes, name, **kw)

    monkeypatch.setattr(experiment_compare, "compare", counting)
    _run(env, "same", env["a"], ["paris"])
    _run(env, "other", env["b"], ["paris"])
    with otel_agenttape.open(env["db"]) as tapes:  # one read model for every call, as the console holds it
        def listed():
            return {e["name"]: e for e in api.experiments(tapes)["experiments"]}

        first = listed()
        assert sorted(compared) == ["other", "same"]
        assert first["same"]["summary"]["runs"] == 2 and first["other"]["summary"]["runs"] == 2
        assert first["other"]["summary"]["answer_changed"] == 2
        assert listed() == first and len(compared) == 2  # nothing new: no experiment compared again

        _run(env, "other", env["b"], ["paris", "oslo"])  # the rerun answers Oslo's two calls
        second = listed()
        assert compared[2:] == ["other"]  # only the experiment that gained runs
        s = second["other"]["summary"]
        assert (s["runs"], second["other"]["originals"]) == (4, 2)
        assert s["answer_changed"] == 4 and s["tool_agreement"] == 0.75  # Oslo's tool call asks for "oslo"
        assert second["same"] == first["same"]

        tapes.use_prices(None)  # other prices: every summary is priced again
        listed()
        assert sorted(compared[3:]) == ["other", "same"]
