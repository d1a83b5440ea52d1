"""Evaluators over recorded runs, everything through one real receiver on 127.0.0.1: each built-in check on a
small sealed store, a custom function (in Python and as MODULE:FUNCTION), the LLM judge against a fake
OpenAI-compatible server (a good answer, garbage, a timeout), reruns that add nothing, and score tapes
that verify."""

from __future__ import annotations

import io
import json
import threading
import time

import pytest
from cost_support import LOCAL_MODEL, OPENAI_USAGE, OPENAI_USD
from cost_support import record as record_cost_store
from experiment_fakes import ChatServer, completion
from tape_agents import start_server

import otel_agenttape
from otel_agenttape import cli
from otel_agenttape.commands.eval import BUILTIN_NAMES
from otel_agenttape.tape.evaluate import EvaluationError, as_result, by_evaluator
from otel_agenttape.tape.read import Tapes
from otel_agenttape.tape.evaluators import BUILTINS
from otel_agenttape.tape.judge import parse_verdict

JSON_OUT = '{"answer": 4}'
RUBRIC = "Score 1 when the answer is correct and complete, 0 when it is wrong."


def _record(tape) -> None:
    """Three sealed runs: a JSON answer with two good tools, a prose answer whose one tool fails (two priced
    calls), and a slow greeting from a model without a price."""
    with tape.run(agent="math", run_id="run-json", input=[{"role": "user", "content": "What is 2+2?"}]) as run:
        with run.model_call(model="gpt-4o", provider="openai", messages="2+2") as call:
            call.finish(text=JSON_OUT, usage=OPENAI_USAGE)
        for city in ("Paris", "Oslo"):
            with run.tool_call("lookup", {"city": city}) as t:
                t.result({"ok": True})
        run.set_output(JSON_OUT)
    with tape.run(agent="geo", run_id="run-prose", input=[{"role": "user", "content": "Capital of France?"}]) as run:
        for _ in range(2):
            with run.model_call(model="gpt-4o", provider="openai", messages="capital") as call:
                call.finish(text="Paris is the capital.", usage=OPENAI_USAGE)
        try:
            with run.tool_call("atlas", {"country": "FR"}):
                raise RuntimeError("atlas is down")
        except RuntimeError:
            pass
        run.set_output("Paris is the capital.")
    with tape.run(agent="greeter", run_id="run-slow", input=[{"role": "user", "content": "Hello"}]) as run:
        with run.model_call(model=LOCAL_MODEL, provider="vllm", messages="hello") as call:
            time.sleep(0.25)
            call.finish(text="Hi there, slowly", usage={"prompt_tokens": 10, "completion_tokens": 5})
        run.set_output("Hi there, slowly")


def _judge(body, n):
    """Good for the JSON answer, garbage for the prose one, too slow for the greeting."""
    text = body["messages"][-1]["content"]
    if "Hi there" in text:
        time.sleep(1.5)
    if '\\"answer\\": 4' in text or '"answer": 4' in text:
        verdict = {"score": 0.9, "label": "correct", "explanation": "2+2 is 4."}
        return 200, completion(body, n, {"role": "assistant", "content": json.dumps(verdict)})
    return 200, completion(body, n, {"role": "assistant", "content": "Looks fine to me!"})


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    db = str(root / "tape.duckdb")
    server = start_server(db)
    tape = otel_agenttape.setup(endpoint=server.url, protocol="http/protobuf", service_name="eval-tests")
    try:
        _record(tape)
        tape.force_flush()
    finally:
        tape.shutdown()
    assert server.wait_idle(30)
    with ChatServer(_judge) as judge:
        yield {"db": db, "server": server, "root": root, "judge": judge}
    server.stop()


def _eval(env, evaluator, **kw):
    with otel_agenttape.open(env["db"]) as tapes:  # through the running receiver; scores go back to it
        summary = otel_agenttape.evaluate(tapes, evaluator, **kw)
    assert env["server"].wait_idle(30)
    return summary


def _scores(env, ev):
    """The evaluator's rows of the ``scores`` view, failed evaluations too, by run id."""
    tapes = Tapes(env["server"].store.reader())
    where, params = by_evaluator(tapes, ev, errors=True)
    rows = tapes.sql(f"SELECT run_ref, name, value, label, explanation, error_type, source FROM scores "
                     f"WHERE {where} ORDER BY run_ref", params).to_pylist()
    return {r["run_ref"].partition("@")[0]: r for r in rows}


def _builtin(name, **kw):
    from otel_agenttape.tape.evaluators import builtin

    return builtin(name, **kw)


@pytest.mark.parametrize("name, options, labels, values", [
    ("json_valid", {}, {"run-json": "pass", "run-prose": "fail", "run-slow": "fail"}, None),
    ("regex", {"pattern": r"\d"}, {"run-json": "pass", "run-prose": "fail", "run-slow": "fail"}, None),
    ("contains", {"pattern": "PARIS"}, {"run-json": "fail", "run-prose": "pass", "run-slow": "fail"}, None),
    ("tool_error_rate", {}, {"run-json": "pass", "run-prose": "fail", "run-slow": "pass"},
     {"run-json": 0.0, "run-prose": 1.0, "run-slow": 0.0}),
    ("latency_budget", {"budget_ms": 200}, {"run-json": "pass", "run-prose": "pass", "run-slow": "fail"}, None),
])
def test_each_builtin_scores_every_run_and_a_rerun_adds_nothing(env, name, options, labels, values):
    ev = _builtin(name, **options)
    first = _eval(env, ev)
    assert (first.selected, first.evaluated, first.skipped, first.errors) == (3, 3, 0, 0)
    got = _scores(env, ev)
    assert {k: r["label"] for k, r in got.items()} == labels
    assert all(r["name"] == name for r in got.values())
    if values:
        assert {k: r["value"] for k, r in got.items()} == pytest.approx(values)
    again = _eval(env, ev)
    assert (again.evaluated, again.skipped) == (0, 3)
    assert len(_scores(env, ev)) == 3 and len(env["server"].query(
        "SELECT 1 FROM scores WHERE name = ?", [name])) == 3


def test_latency_values_are_the_durations(env):
    ev = _builtin("latency_budget", budget_ms=100_000)
    _eval(env, ev)
    got = _scores(env, ev)
    assert got["run-slow"]["value"] >= 250 > got["run-json"]["value"]


def test_exact_match_against_a_reference_file_skips_inputs_it_lacks(env):
    ref = env["root"] / "reference.jsonl"
    lines = [{"input": "What is 2+2?", "expected": JSON_OUT}, {},
             {"input": [{"role": "user", "content": "Capital of France?"}], "expected": "Lyon"}]
    ref.write_text("\n".join(json.dumps(line) if line else "" for line in lines) + "\n")
    ev = _builtin("exact_match", reference=str(ref))
    summary = _eval(env, ev)
    assert (summary.evaluated, summary.not_applicable) == (2, 1)
    got = _scores(env, ev)
    assert {k: r["label"] for k, r in got.items()} == {"run-json": "pass", "run-prose": "fail"}
    assert "Lyon" in got["run-prose"]["explanation"]
    bad = env["root"] / "bad.jsonl"
    bad.write_text('{"input": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: needs"):
        _builtin("exact_match", reference=str(bad))


def test_cost_budget_prices_each_run_and_an_unknown_cost_is_an_error_not_a_score(env):
    ev = _builtin("cost_budget", budget_usd=0.01)
    summary = _eval(env, ev)
    assert (summary.evaluated, summary.errors, summary.error_types) == (2, 1, {"cost_unknown": 1})
    got = _scores(env, ev)
    assert got["run-json"]["value"] == pytest.approx(OPENAI_USD) and got["run-json"]["label"] == "pass"
    assert got["run-prose"]["value"] == pytest.approx(2 * OPENAI_USD) and got["run-prose"]["label"] == "fail"
    slow = got["run-slow"]
    assert (slow["value"], slow["label"], slow["error_type"]) == (None, None, "cost_unknown")
    # the failed one is tried again, the scored ones are not
    again = _eval(env, ev)
    assert (again.skipped, again.errors, again.evaluated) == (2, 1, 0)


def test_a_custom_function_with_a_name_and_version_its_failures_and_bounded_concurrency(env):
    state = {"now": 0, "most": 0}
    lock = threading.Lock()

    @otel_agenttape.evaluator("short_answer", version="2")
    def short(run):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.1)
        with lock:
            state["now"] -= 1
        if run.agent == "greeter":
            raise KeyError("no greeting rules")
        return {"value": len(run.output), "label": "short" if len(run.output) < 15 else "long",
                "explanation": f"{len(run.output)} characters"}

    bar = io.StringIO()
    summary = _eval(env, short, concurrency=2, progress=bar)
    assert state["most"] == 2
    assert (summary.evaluator, summary.evaluated, summary.errors) == ("short_answer@2", 2, 1)
    assert summary.error_types == {"KeyError": 1} and summary.failed[0]["ref"].startswith("run-slow@")
    assert "3/3" in bar.getvalue() and "\r" in bar.getvalue()
    got = _scores(env, short)
    assert got["run-json"]["value"] == len(JSON_OUT) and got["run-json"]["label"] == "short"
    assert got["run-slow"]["error_type"] == "KeyError" and got["run-slow"]["value"] is None
    # another version of it is another evaluator: every run again
    assert _eval(env, short, version="3", agent="math").evaluated == 1


def test_the_llm_judge_records_good_answers_and_errors_for_garbage_and_timeouts(env):
    rubric = env["root"] / "rubric.md"
    rubric.write_text(RUBRIC)
    judge = env["judge"]
    ev = _builtin("llm_judge", judge={"model": "judge-1", "base_url": judge.base_url, "rubric": str(rubric),
                                      "timeout": 0.5})
    summary = _eval(env, ev, concurrency=3)
    assert (summary.evaluated, summary.errors) == (1, 2), summary.failed
    assert summary.error_types == {"invalid_output": 1, "timeout": 1}
    got = _scores(env, ev)
    assert (got["run-json"]["value"], got["run-json"]["label"], got["run-json"]["error_type"]) == (0.9, "correct", None)
    for ref, kind in (("run-prose", "invalid_output"), ("run-slow", "timeout")):
        assert (got[ref]["value"], got[ref]["label"], got[ref]["error_type"]) == (None, None, kind)
    sent = [b for b in judge.requests if b["model"] == "judge-1"]
    assert len(sent) == 3 and all(RUBRIC in b["messages"][0]["content"] for b in sent)
    assert sent[0]["response_format"]["json_schema"]["strict"] is True
    assert any("Capital of France?" in b["messages"][1]["content"] for b in sent)
    # a rerun asks the judge again only about what failed
    again = _eval(env, ev, concurrency=3)
    assert (again.skipped, again.errors) == (1, 2)
    assert len([b for b in judge.requests if b["model"] == "judge-1"]) == 5


@pytest.mark.parametrize("content, ok", [
    ('{"score": 1, "label": "good", "explanation": "fine"}', True),
    ('{"score": 0.5, "label": "ok"}', False),
    ('{"score": 1.5, "label": "good", "explanation": "x"}', False),
    ('{"score": "1", "label": "good", "explanation": "x"}', False),
    ('{"score": 1, "label": "good", "explanation": "x", "extra": 1}', False),
    ('```json\n{"score": 1, "label": "good", "explanation": "x"}\n```', False),
    ("[1]", False), ("", False), (None, False),
])
def test_the_judges_answer_is_parsed_strictly(content, ok):
    if ok:
        assert parse_verdict(content).value == 1.0
    else:
        with pytest.raises(EvaluationError) as err:
            parse_verdict(content)
        assert err.value.error_type == "invalid_output"


def test_answers_that_are_not_scores_are_invalid_results():
    assert as_result(True).label == "pass" and as_result(0.25).value == 0.25 and as_result("meh").label == "meh"
    assert as_result({"nope": 1}).error_type == "invalid_result"
    assert as_result([1]).error_type == "invalid_result"


def _cli(*args, capsys=None):
    code = cli.main(list(args))
    out = capsys.readouterr() if capsys else None
    return code, out


def test_cli_custom_module_function_on_the_served_store(env, tmp_path, monkeypatch, capsys):
    (tmp_path / "myevals.py").write_text(
        "def polite(run):\n"
        "    return 'pass' if 'please' in run.input_text.lower() or 'Hi' in run.output else 'fail'\n"
        "polite.version = '7'\n")
    monkeypatch.chdir(tmp_path)
    code, out = _cli("eval", "myevals:polite", "--db", env["db"], "--json", capsys=capsys)
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert (doc["evaluator"], doc["evaluated"], doc["labels"]) == ("polite@7", 3, {"fail": 2, "pass": 1})
    assert env["server"].wait_idle(30)
    code, out = _cli("eval", "myevals:polite", "--db", env["db"], capsys=capsys)
    assert code == 0 and "3 runs selected, 0 evaluated, 3 skipped (already scored), 0 errors" in out.out
    code, out = _cli("eval", "myevals:nothing", "--db", env["db"], capsys=capsys)
    assert code == 2 and "myevals has no nothing" in out.err
    code, out = _cli("eval", "regex", "--db", env["db"], capsys=capsys)
    assert code == 2 and "regex: give --pattern RE" in out.err
    code, out = _cli("eval", "json_valid", "--lake", str(tmp_path), capsys=capsys)
    assert code == 2 and "need --endpoint URL" in out.err
    code, out = _cli("eval", "llm_judge", "--judge-model", "judge-2", "--db", env["db"], capsys=capsys)
    assert code == 2 and "give a rubric file (--rubric FILE)" in out.err


def test_cli_llm_judge_flags(env, capsys):
    rubric = env["root"] / "cli-rubric.md"
    rubric.write_text(RUBRIC)
    code, out = _cli("eval", "llm_judge", "--judge-model", "judge-2", "--judge-base-url", env["judge"].base_url,
                     "--rubric", str(rubric), "--judge-timeout", "0.5", "--agent", "math", "--db", env["db"],
                     "--json", capsys=capsys)
    doc = json.loads(out.out)
    assert code == 0 and (doc["selected"], doc["evaluated"], doc["labels"]) == (1, 1, {"correct": 1})
    assert doc["evaluator"].startswith("llm_judge@judge-2-")
    code, out = _cli("eval", "llm_judge", "--judge-model", "judge-2", "--judge-base-url", env["judge"].base_url,
                     "--rubric", str(rubric), "--judge-timeout", "0.5", "--agent", "geo", "--db", env["db"],
                     capsys=capsys)
    assert code == 1 and "1 errors" in out.out and "invalid_output" in out.out


def test_cli_on_a_store_no_receiver_holds_starts_one_and_the_score_tapes_verify(tmp_path, capsys):
    db = record_cost_store(tmp_path)  # a DuckDB file loaded by ingest; nothing serves it
    code, out = _cli("eval", "cost_budget", "--budget-usd", "0.01", "--db", db, capsys=capsys)
    assert code == 1  # the runs of the unpriced model cannot be judged: error.type recorded, exit 1
    assert "3 runs selected, 1 evaluated, 0 skipped (already scored), 2 errors" in out.out
    assert "cost_unknown" in out.out
    code, out = _cli("eval", "cost_budget", "--budget-usd", "0.01", "--db", db, "--prices",
                     str(_prices(tmp_path)), capsys=capsys)
    assert code == 0 and "3 runs selected, 2 evaluated, 1 skipped (already scored), 0 errors" in out.out
    with otel_agenttape.open(db) as tapes:
        rows = tapes.sql("SELECT run_ref, value, label, error_type FROM scores ORDER BY run_ref").to_pylist()
        assert len(rows) == 5 and {r["run_ref"].partition("@")[0] for r in rows} == {
            "run-planner", "run-helper", "run-second"}
        # each call's scores share one sealed score span (a tape of its own), one event per score
        assert tapes.sql("SELECT count(*) AS n FROM spans WHERE name = 'agenttape.score' AND chain_id IS NOT NULL"
                         ).to_pylist()[0]["n"] == 2
        assert len(tapes.runs().runs) == 3  # a score tape is not a run
    code, out = _cli("verify", "--db", db, capsys=capsys)
    assert code == 0 and "BROKEN" not in out.out and out.out.count("ok ") >= 2


def _prices(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({LOCAL_MODEL: {"input_mtok": 1.0, "output_mtok": 2.0}}))
    return path


def test_the_cli_names_every_builtin():
    assert set(BUILTIN_NAMES) == set(BUILTINS)
