"""Node-level experiments against two OpenAI-compatible servers on 127.0.0.1, a failing one, and compare's
numbers checked by hand; everything recorded through one real receiver."""

from __future__ import annotations

import io
import json
import threading

import pytest
from experiment_fakes import ChatServer, completion, last_city
from tape_agents import ScriptedModel, ScriptedTools, flush, recorder, start_server, weather_agent

import otel_agenttape
from otel_agenttape import cli
from otel_agenttape.tape.experiment import Candidate, experiment_refs, run_experiment
from otel_agenttape.pricing import Prices, Rates
from otel_agenttape.tape.experiment_compare import check_gates, register_evaluator


def _tool_call(city: str, n: int, content: str) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": [{
        "id": f"call_{n}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}


def same(body, n):
    """Answers exactly as the recorded model did."""
    last = body["messages"][-1]
    if last.get("role") == "tool":
        d = json.loads(last["content"])
        return 200, completion(body, n, {"role": "assistant", "content": f"In {d['city']} it is {d['temp']}F."},
                               prompt_tokens=30, completion_tokens=8)
    return 200, completion(body, n, _tool_call(last_city(body), n, "Checking."), "tool_calls", 12, 3)


def different(body, n):
    """Another model: other words, and a lower-cased city for Oslo's tool call."""
    last = body["messages"][-1]
    if last.get("role") == "tool":
        d = json.loads(last["content"])
        return 200, completion(body, n, {"role": "assistant", "content": f"{d['city']}: {d['temp']}F"},
                               prompt_tokens=40, completion_tokens=10)
    city = last_city(body)
    return 200, completion(body, n, _tool_call(city.lower() if city == "Oslo" else city, n, "  checking. "),
                           "tool_calls", 20, 5)


class Flaky:
    """Like ``same``, but a 500 for every call about Oslo while ``failing``."""

    def __init__(self) -> None:
        self.failing = True

    def __call__(self, body, n):
        if self.failing and "Oslo" in json.dumps(body["messages"]):
            return 500, {"error": {"message": "overloaded", "type": "server_error"}}
        return same(body, n)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("experiments")
    db = str(root / "tape.duckdb")
    server = start_server(db)
    tape = recorder(server)
    try:
        for city in ("Paris", "Oslo"):
            weather_agent(tape, ScriptedModel(), ScriptedTools(), f"Weather in {city}?", run_id=city.lower())
        flush(tape, server)
    finally:
        tape.shutdown()
    flaky = Flaky()
    with ChatServer(same) as a, ChatServer(different) as b, ChatServer(flaky) as c:
        yield {"db": db, "server": server, "root": root, "a": a, "b": b, "c": c, "flaky": flaky}
    server.stop()


def _run(env, name, fake, **kw):
    result = run_experiment(env["db"], name, Candidate(f"cand-{name}", base_url=fake.base_url), refs=["paris", "oslo"],
                            endpoint=env["server"].url, journal=env["root"] / f"{name}.sqlite", seal=False, **kw)
    assert env["server"].wait_idle(30)
    return result


@pytest.fixture(scope="module")
def recorded(env):
    return {"a": _run(env, "a", env["a"]), "b": _run(env, "b", env["b"])}


def test_each_recorded_prompt_reaches_the_candidate_exactly_and_each_answer_is_a_linked_run(env, recorded):
    assert recorded["a"].to_json()["answered"] == 4 and recorded["a"].failed == 0
    with otel_agenttape.open(env["db"]) as tapes:
        original = tapes.rebuild("paris")
        first = original.model_nodes[0]
        sent = env["a"].requests[0] if env["a"].requests[0]["messages"][-1]["content"] == "Weather in Paris?" else \
            next(r for r in env["a"].requests if r["messages"][-1].get("content") == "Weather in Paris?")
        assert sent["model"] == "cand-a"
        assert sent["messages"] == [{"role": "system", "content": "You are a terse travel assistant."},
                                    {"role": "user", "content": "Weather in Paris?"}]
        assert sent["tools"][0]["function"]["name"] == "get_weather"
        mine = experiment_refs(tapes, "a")
        assert len(mine) == 4
        links = {(r["of"], r["node"]) for r in mine.values()}
        assert (original.ref, first.span_id) in links
        listed = tapes.experiment_runs("a")
        assert {r.ref for r in listed} == set(mine) and all(r.status == "completed" for r in listed)
        # the originals are untouched: still two model calls and one tool call each, no experiment mark
        assert len(tapes.rebuild("paris").model_nodes) == 2
        assert tapes.experiment_of(["paris@" + original.trace_id]) == {}


def test_compare_numbers_by_hand(env, recorded):
    with otel_agenttape.open(env["db"]) as tapes:
        s = tapes.compare("a").summary()
        assert (s["runs"], s["errors"], s["answer_same"], s["tool_agreement"]) == (4, 0, 1.0, 1.0)
        assert s["candidate_cost_usd"] is None and s["baseline_cost_usd"] is None  # unknown, never 0
        register_evaluator("mentions_temp", lambda node: 1.0 if "F" in node.output_text else 0.0)
        # self-hosted models: priced by overrides (1 and 2 dollars per million input / output tokens)
        rates = Rates(input=1e-6, output=2e-6, cache_read=1e-6, cache_write=1e-6, source="override")
        tapes.use_prices(Prices({(None, "fake-1"): rates, (None, "cand-b"): rates}))
        try:
            cmp = tapes.compare("b", evals=["mentions_temp"])
        finally:
            register_evaluator("mentions_temp", None)
    s = cmp.summary()
    # Paris 1: text differs only in spaces/case; Paris 2 and Oslo 2: new words; Oslo 1: tool argument "oslo"
    assert s["answer_same"] == 0.0 and s["answer_changed"] == 4
    assert s["answer_same_normalised"] == 0.25 and s["answer_changed_normalised"] == 3
    assert s["tool_agreement"] == 0.75
    assert (s["baseline_input_tokens"], s["baseline_output_tokens"]) == (84, 22)
    assert (s["candidate_input_tokens"], s["candidate_output_tokens"]) == (120, 30)
    assert s["candidate_cost_usd"] == pytest.approx(120e-6 + 60e-6)
    assert s["baseline_cost_usd"] == pytest.approx(84e-6 + 44e-6)
    assert s["mentions_temp"] == 0.5 and s["mentions_temp_baseline"] == 0.5
    lat = [p.side(p.candidate)["latency_ms"] for p in cmp.pairs]
    assert all(v > 0 for v in lat) and s["candidate_latency_ms"] == pytest.approx(sum(lat) / 4)
    oslo_first = next(p for p in cmp.pairs if p.of.startswith("oslo@") and p.baseline.requested_tool_calls)
    assert oslo_first.tools_agree is False and oslo_first.side(oslo_first.candidate)["tool_calls"] == [
        {"name": "get_weather", "arguments": {"city": "oslo"}}]
    assert [g.failed for g in check_gates(s, ["tool_agreement<0.9", "answer_same_normalised>=0.25",
                                              "candidate_cost_usd>1"])] == [True, True, False]


def _cli(*args):
    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out):
        code = cli.main(list(args))
    return code, out.getvalue()


def test_cli_compare_gate_exit_codes_and_other_baseline(env, recorded):
    code, text = _cli("experiment", "compare", "b", "--db", env["db"], "--fail-if", "answer_same_normalised<0.9")
    assert code == 1 and "gate answer_same_normalised<0.9: FAILED" in text and "cost_usd: unknown" in text
    code, text = _cli("experiment", "compare", "a", "--db", env["db"], "--fail-if", "answer_same<0.9", "--json")
    doc = json.loads(text)
    assert code == 0 and doc["gates"] == [{"gate": "answer_same<0.9", "metric": "answer_same", "value": 1.0,
                                           "failed": False}]
    code, text = _cli("experiment", "compare", "b", "--baseline", "a", "--db", env["db"], "--json")
    doc = json.loads(text)
    assert code == 0 and doc["baseline"] == "a" and doc["summary"]["tool_agreement"] == 0.75
    assert {r["baseline_ref"] for r in doc["runs"]} == set(experiment_refs(otel_agenttape.open(env["db"]), "a"))
    code, _ = _cli("experiment", "compare", "b", "--db", env["db"], "--fail-if", "nonsense<1")
    assert code == 2
    code, _ = _cli("experiment", "compare", "nope", "--db", env["db"])
    assert code == 2


def test_runs_lists_an_experiment_and_marks_experiment_runs(env, recorded):
    code, text = _cli("runs", "--db", env["db"], "--experiment", "a", "--json")
    rows = json.loads(text)
    assert code == 0 and len(rows) == 4 and {r["experiment"] for r in rows} == {"a"}
    code, text = _cli("runs", "--db", env["db"], "--json", "--limit", "50")
    rows = json.loads(text)
    assert {r["run_id"] for r in rows if "experiment" not in r} == {"paris", "oslo"}
    assert sum(1 for r in rows if r.get("experiment") == "b") == 4
    code, text = _cli("experiment", "list", "--db", env["db"], "--json")
    listed = {e["name"]: e for e in json.loads(text)}
    assert listed["a"]["runs"] == 4 and listed["a"]["originals"] == 2 and listed["b"]["models"] == ["cand-b"]


def test_failures_are_recorded_and_a_rerun_retries_only_them(env, recorded):
    first = _run(env, "flaky", env["c"], concurrency=3)
    assert (first.answered, first.failed, first.skipped) == (2, 2, 0)
    assert all("overloaded" in r["error"] for r in first.runs if r["error"])
    with otel_agenttape.open(env["db"]) as tapes:
        s = tapes.compare("flaky").summary()
        assert s["errors"] == 2 and s["error_rate"] == 0.5
        assert sorted(r.status for r in tapes.experiment_runs("flaky")) == ["completed", "completed", "error", "error"]
    env["flaky"].failing = False
    before = len(env["c"].requests)
    again = _run(env, "flaky", env["c"])
    assert (again.answered, again.failed, again.skipped) == (2, 0, 2)
    assert len(env["c"].requests) - before == 2
    assert all("Oslo" in json.dumps(r["messages"]) for r in env["c"].requests[before:])
    with otel_agenttape.open(env["db"]) as tapes:
        s = tapes.compare("flaky").summary()  # the retried attempt is the one compared
        assert s["errors"] == 0 and s["answer_same"] == 1.0 and s["runs"] == 4
    third = _run(env, "flaky", env["c"])
    assert (third.answered, third.skipped) == (0, 4)


def test_overrides_and_dataset_rows(env, recorded, tmp_path):
    prompt = tmp_path / "system.txt"
    prompt.write_text("Answer in French.")
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Weather in Lima?"},
                                             {"role": "assistant", "content": "In Lima it is 66F."}]}) + "\n"
                    + json.dumps({"ref": "paris"}) + "\n")
    before = len(env["a"].requests)
    code, text = _cli("experiment", "run", "fr", "--model", "cand-fr", "--base-url", env["a"].base_url,
                      "--system-prompt", str(prompt), "--temperature", "0.2", "--dataset", str(data),
                      "--db", env["db"], "--endpoint", env["server"].url, "--journal", str(tmp_path / "fr.sqlite"),
                      "--no-seal", "--json")
    assert code == 0 and json.loads(text)["answered"] == 3
    sent = env["a"].requests[before:]
    assert all(r["messages"][0] == {"role": "system", "content": "Answer in French."} for r in sent)
    assert all(r["temperature"] == 0.2 and r["model"] == "cand-fr" for r in sent)
    assert any(r["messages"][1:] == [{"role": "user", "content": "Weather in Lima?"}] for r in sent)
    code, _ = _cli("experiment", "run", "x", "--model", "m", "--dataset", str(tmp_path / "missing.jsonl"),
                   "--db", env["db"])
    assert code == 2


def test_cli_compare_runs_built_in_and_module_evaluators_on_both_sides(env, recorded, tmp_path, monkeypatch):
    (tmp_path / "terse_eval.py").write_text("def terse(run):\n    return 'checking' in run.output.casefold()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, text = _cli("experiment", "compare", "b", "--db", env["db"], "--json", "--eval", r"regex=it is \d+F",
                      "--eval", "terse_eval:terse", "--eval", "json_valid", "--fail-if", "regex<0.5")
    s = json.loads(text)["summary"]
    # of the four model calls a side, two answer with the weather: the originals say "In Paris it is ..F.",
    # candidate b "Paris: ..F"; the other two ask for the tool ("Checking." / "  checking. ")
    assert s["regex_baseline"] == 0.5 and s["regex"] == 0.0
    assert s["terse_baseline"] == 0.5 and s["terse"] == 0.5
    assert s["json_valid"] == 0.0 and s["json_valid_baseline"] == 0.0
    assert code == 1  # the candidate's regex score is under the gate
    code, err = _cli("experiment", "compare", "b", "--db", env["db"], "--eval", "contains")
    assert code == 2
    code, _ = _cli("experiment", "compare", "b", "--db", env["db"], "--eval", "no_such_check")
    assert code == 2
    code, _ = _cli("experiment", "compare", "b", "--db", env["db"], "--eval", "regex=a", "--eval", "regex=b")
    assert code == 2
    register_evaluator("terse", None)
