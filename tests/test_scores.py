"""Scores end to end through a real ``agenttape serve`` on 127.0.0.1: a web app's runs scored while they run,
a thumbs-up and a correction from other processes minutes later while the receiver restarts (nothing lost),
another instrumentation's evaluation events, and a training set of only the runs above a score."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from capture_servers import free_port, free_ports, serve_process, stop_process
from receiver_util import free_env

import otel_agenttape
from otel_agenttape import cli
from otel_agenttape.capture.scores import ScoreError

HERE = Path(__file__).parent


class Receiver:
    """``agenttape serve`` in its own process on fixed ports, so it can be stopped and started again."""

    def __init__(self, db: str) -> None:
        (self.db, (self.http, self.grpc)) = db, free_ports(2)
        self.url = f"http://127.0.0.1:{self.http}"
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc, _ = serve_process(self.db, self.http, self.grpc)

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    r = Receiver(str(tmp_path_factory.mktemp("scores") / "t.duckdb"))
    yield r
    r.stop()


@pytest.fixture(scope="module")
def recorded(receiver):
    """The web app's three runs: good (quality 0.9), meh (0.5) and plain (not scored)."""
    done = subprocess.run([sys.executable, str(HERE / "scores_app.py"), receiver.url], capture_output=True,
                          text=True, timeout=120, env=free_env())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def score_cli(*args: str, env: dict | None = None) -> tuple[int, dict]:
    """``agenttape score ... --json`` in a process of its own (the web app's request handler)."""
    done = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "score", *args, "--json"],
                          capture_output=True, text=True, timeout=60, env=env or free_env())
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr}


def until(what, check, timeout: float = 30.0):
    """``what()`` once ``check`` holds for it (the receiver stores asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = what()
        except otel_agenttape.RunNotFound:  # its spans not stored yet
            if time.monotonic() > deadline:
                raise
        else:
            if check(got) or time.monotonic() > deadline:
                return got
        time.sleep(0.1)


def cli_json(*argv: str) -> object:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return json.loads(out.getvalue())


def test_scores_from_other_processes_arrive_across_a_receiver_restart_and_are_sealed(receiver, recorded, tmp_path):
    meh, good = recorded["meh"]["ref"], recorded["good"]["ref"]
    assert recorded["scores_invalid"] == 3  # run.score("") returned False in each run, nothing raised
    box = str(tmp_path / "outbox")
    code, thumbs = score_cli(meh, "thumbs", "--label", "up", "--endpoint", receiver.url, "--outbox", box)
    assert code == 0 and thumbs["state"] == "delivered", thumbs

    receiver.stop()  # a correction minutes later, while the receiver is down: kept in the outbox
    code, fixed = score_cli(meh, "helpfulness", "--value", "0.95", "--explanation", "solved after all",
                            "--endpoint", receiver.url, "--outbox", box, "--wait", "1", "--timeout", "1")
    assert code == 0 and fixed["state"] == "kept in the outbox" and fixed["outbox_spans_pending"] >= 1, fixed
    code, lost = score_cli(meh, "lost", "--value", "1", "--endpoint", receiver.url, "--wait", "1", "--timeout", "1")
    assert code == 1 and lost["state"] == "not delivered"  # no outbox: said so, exit 1

    receiver.start()  # the next score from the same outbox delivers the backlog first
    code, judged = score_cli(meh, "correctness", "--label", "pass", "--source", "judge@7",
                             "--endpoint", receiver.url, "--outbox", box)
    assert code == 0 and judged["state"] == "delivered" and judged["outbox_spans_pending"] == 0, judged

    with otel_agenttape.open(receiver.url) as tapes:
        rows = until(lambda: tapes.scores(meh), lambda rows: len(rows) >= 6)
        got = [(r["name"], r["value"], r["label"], r["source"], r["version"]) for r in rows]
        assert got == [("fluency", 0.8, None, "code", None), ("quality", 0.5, None, "rubric", "2"),
                       ("helpfulness", 0.5, None, "code", None), ("thumbs", None, "up", "human", None),
                       ("helpfulness", 0.95, None, "human", None), ("correctness", None, "pass", "judge", "7")]
        assert rows[4]["explanation"] == "solved after all"
        assert rows[0]["span_id"] == recorded["meh"]["model_span"]  # the node score names its model call
        run = tapes.run(meh)
        assert run.scores["helpfulness"]["value"] == 0.95 and run.scores["helpfulness"]["source"] == "human"
        assert {r.ref for r in tapes.runs(score="helpfulness>=0.8").runs} == {good, meh}  # the latest counts
        assert [r.ref for r in tapes.runs(score=["helpfulness>=0.9", "thumbs=1"]).runs] == []
        assert [r.ref for r in tapes.runs(label="thumbs=up", agent="helper").runs] == [meh]
        assert tapes.run(good).scores["latency_ok"]["label"] == "yes"  # scored after it ended
        listed = cli_json("runs", "--db", receiver.url, "--score", "helpfulness>0.9", "--label", "correctness=pass",
                          "--json")
        assert [r["ref"] for r in listed] == [meh]
        # the scores given while their span was open also left as log records parented to it, listed once
        logs = tapes.sql("SELECT span_id FROM log_records WHERE event_name = 'gen_ai.evaluation.result'").to_pylist()
        assert {"span_id": recorded["meh"]["model_span"]} in logs and len(logs) == 7  # 3 per scored run, 1 later
        assert len(tapes.scores(name="fluency")) == 2
        # every score tape is sealed and verifies, the runs' own tapes untouched
        chains = {c["chain_id"]: c for c in tapes.verify()}
        for doc in (thumbs, fixed, judged):
            assert chains[doc["tape"]]["valid"] and chains[doc["tape"]]["length"] == 1, doc
        assert chains["meh"]["valid"] and chains["meh"]["length"] == 2
        assert all(c["valid"] for c in chains.values())


def test_another_instrumentations_evaluation_events_are_listed(receiver):
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    resource = Resource.create({"service.name": "support-bot"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces")))
    logs = LoggerProvider(resource=resource)
    logs.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{receiver.url}/v1/logs")))
    tracer = provider.get_tracer("their.instrumentation")
    with tracer.start_as_current_span("invoke_agent support", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support"}) as agent:
        with tracer.start_as_current_span("chat gpt-x", attributes={
                "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-x"}) as chat:
            chat.add_event("gen_ai.evaluation.result", {
                "gen_ai.evaluation.name": "relevance", "gen_ai.evaluation.score.value": 0.75,
                "gen_ai.evaluation.score.label": "relevant", "gen_ai.evaluation.explanation": "on topic"})
    from opentelemetry._logs import LogRecord

    ctx = agent.get_span_context()
    logs.get_logger("their.evaluator").emit(LogRecord(
        trace_id=ctx.trace_id, span_id=ctx.span_id, trace_flags=ctx.trace_flags, event_name="gen_ai.evaluation.result",
        attributes={"gen_ai.evaluation.name": "toxicity", "gen_ai.evaluation.score.value": 0.02}))
    provider.shutdown()
    logs.shutdown()
    ref = f"{ctx.span_id:016x}@{ctx.trace_id:032x}"
    with otel_agenttape.open(receiver.url) as tapes:
        rows = until(lambda: tapes.scores(ref), lambda rows: len(rows) >= 2)
        assert sorted((r["name"], r["value"], r["label"], r["source"], r["via"]) for r in rows) == [
            ("relevance", 0.75, "relevant", "otel", "span_event"), ("toxicity", 0.02, None, "otel", "log")]
        assert {r["span_id"] for r in rows} == {f"{chat.get_span_context().span_id:016x}", f"{ctx.span_id:016x}"}
        run = tapes.run(ref)
        assert run.source == "otel-genai" and set(run.scores) == {"relevance", "toxicity"}
        assert [r.ref for r in tapes.runs(score="relevance>0.5", label="relevance=relevant").runs] == [ref]
        assert [r.ref for r in tapes.runs(score="toxicity<0.1").runs] == [ref]


def test_the_dataset_keeps_only_the_runs_above_the_score_and_counts_the_rest(receiver, recorded, tmp_path):
    out = tmp_path / "train.jsonl"
    counts = io.StringIO()
    with contextlib.redirect_stdout(counts):
        assert cli.main(["dataset", str(out), "--db", receiver.url, "--agent", "helper",
                         "--score", "quality>=0.8", "--json"]) == 0
    lines = counts.getvalue().splitlines()
    assert lines[0] == "wrote 1 example(s); skipped 1 no_score:quality, 1 score_not_met:quality>=0.8"
    assert json.loads(lines[1]) == {"written": 1, "skipped": {"no_score:quality": 1, "score_not_met:quality>=0.8": 1}}
    examples = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(examples) == 1 and "(good)" in examples[0]["messages"][-1]["content"]
    with otel_agenttape.open(receiver.url) as tapes:
        result = tapes.dataset(io.StringIO(), agent="helper", label="fluency=great")
        assert result.written == 0 and dict(result.skipped) == {"no_label:fluency": 3}
    with pytest.raises(ValueError, match="NAME>=VALUE"):
        otel_agenttape.open(receiver.url).runs(score="quality")


def test_a_score_naming_a_model_response_id_scores_that_call(receiver, recorded):
    tape = otel_agenttape.setup(receiver.url)
    tape.score("resp-plain", "thumbs", label="down", source="human")  # all a chat widget knows
    with pytest.raises(ScoreError, match="value, a label"):
        tape.score(recorded["plain"]["ref"], "thumbs")
    tape.shutdown()
    with otel_agenttape.open(receiver.url) as tapes:
        (row,) = until(lambda: tapes.scores(name="thumbs", source="human", span_id=recorded["plain"]["model_span"]),
                       lambda rows: len(rows) == 1)
        assert row["run_ref"] == recorded["plain"]["ref"] and row["label"] == "down"
        assert row["response_id"] == "resp-plain"
