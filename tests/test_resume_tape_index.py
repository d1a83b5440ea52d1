"""The resume index rebuilt from the tape store, OTLP files and the live sealing feed."""

from __future__ import annotations

import json
import os

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agenttape
from otel_agenttape import semconv as sc
from otel_agenttape.cli import main as cli
from otel_agenttape.resume import ResumableModelClient, ResumableToolExecutor, ResumeIndex
from otel_agenttape.resume.spans import node_feed
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.resume_index import build_resume_index


class Counting:
    def __init__(self) -> None:
        self.model = 0
        self.tools = 0

    def create(self, request):
        self.model += 1
        return {"text": f"answer {self.model}", "usage": {"input_tokens": 1}}

    def stream(self, request):
        self.model += 1
        yield from ("str", "eam ", str(self.model))

    def tool_map(self):
        def add(a: int, b: int) -> int:
            self.tools += 1
            return a + b

        def echo(text: str) -> str:
            self.tools += 1
            return text

        return {"add": add, "echo": echo}


def agent(index: ResumeIndex, world: Counting, run=None) -> list:
    m = ResumableModelClient(world, index, run=run)
    t = ResumableToolExecutor(world.tool_map(), index, run=run)
    out = []
    for i in range(3):
        out.append(m.create({"model": "x", "messages": [{"role": "user", "content": f"q{i}"}], "temperature": 0}))
        out.append(t.execute("add", {"a": i, "b": 1}, call_id=f"c{i}"))
        out.append(t.execute("echo", {"text": "[not json"}))  # identical repeats, a string result
        out.append(t.execute("echo", {"text": "42"}))  # a string that looks like JSON stays a string
    s = m.stream({"model": "x", "messages": [{"role": "user", "content": "s"}]})
    out.append(list(s))
    out.append(s.result)
    return out


def record(tmp_path, run_id: str = "run-1"):
    exporter = InMemorySpanExporter()
    feed_index = ResumeIndex(run_id)
    tape = otel_agenttape.setup(exporter=exporter, seal=True, seal_options={
        "checkpoint_file": str(tmp_path / "checkpoints.jsonl"), "on_node": node_feed(feed_index)})
    world = Counting()
    index = ResumeIndex(run_id, journal=tmp_path / "journal.sqlite")
    with tape.run(agent="a", run_id=run_id) as run:
        first = agent(index, world, run)
    tape.force_flush()
    tape.shutdown()
    return exporter.get_finished_spans(), first, world, index, feed_index


def test_rebuilt_index_resumes_on_another_machine_with_zero_calls(tmp_path):
    spans, first, world, journal_index, _ = record(tmp_path)
    assert (world.model, world.tools) == (4, 9)
    store = Store(None)
    store.write_traces([encode_spans(spans)])
    rebuilt = build_resume_index(store.reader(), "run-1")
    assert {str(e.key): e.result for e in rebuilt.entries()} == {
        str(e.key): e.result for e in journal_index.entries()}
    path = tmp_path / "moved.json"
    rebuilt.save_json(path)

    elsewhere = ResumeIndex.load_json(path, replay_only=True)
    again = agent(elsewhere, world)
    assert again == first and (world.model, world.tools) == (4, 9)
    assert elsewhere.model_hits == 4 and elsewhere.tool_hits == 9


def test_sealing_processor_feeds_the_index_live(tmp_path):
    _, _, _, journal_index, feed_index = record(tmp_path)
    assert len(feed_index) == len(journal_index) == 13
    for e in journal_index.entries():
        fed = feed_index.get(e.key)
        assert fed is not None and fed.result == e.result, e.key


def test_cli_resume_index_from_otlp_file(tmp_path, capsys):
    spans, first, world, _, _ = record(tmp_path)
    otlp = tmp_path / "traces.pb"
    otlp.write_bytes(encode_spans(spans).SerializeToString())
    out = tmp_path / "index.json"
    assert cli(["resume-index", "run-1", "--otlp", str(otlp), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"run": "run-1", "out": str(out), "model": 4, "tool": 9}
    loaded = ResumeIndex.load_json(out)
    assert agent(loaded, world) == first and world.model == 4
    assert cli(["resume-index", "nope", "--otlp", str(otlp), "--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err == "agenttape: error: run not found: nope\n"  # as show and replay say
    missing_dir = tmp_path / "no" / "such" / "o.json"
    assert cli(["resume-index", "run-1", "--otlp", str(otlp), "--out", str(missing_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agenttape: error: cannot write {missing_dir}:") and len(err.splitlines()) == 1
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "o.json").mkdir()  # a folder where the file should go: no temp file is left behind
    assert cli(["resume-index", "run-1", "--otlp", str(otlp), "--out", str(tmp_path / "ro" / "o.json")]) == 2
    assert os.listdir(tmp_path / "ro") == ["o.json"]


def test_foreign_spans_without_keys_still_resume(tmp_path):
    """Spans another instrumentation recorded: tools by name + arguments, models by position."""
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal=False)
    with tape.run(agent="a", run_id="foreign") as run:
        for i in range(2):
            with run.model_call("x", [{"role": "user", "content": f"q{i}"}]) as call:
                call.finish(raw={"text": f"foreign {i}"})
            with run.tool_call("add", {"a": i, "b": 1}, call_id=f"t{i}") as tool:
                tool.result(i + 1)
    tape.shutdown()
    store = Store(None)
    store.write_traces([encode_spans(exporter.get_finished_spans())])
    index = build_resume_index(store.reader(), "foreign")
    assert [e.match for e in index.entries("model")] == ["position", "position"]
    world = Counting()
    m = ResumableModelClient(world, index)
    t = ResumableToolExecutor(world.tool_map(), index)
    got = [m.create({"messages": [{"role": "user", "content": "q0"}]}), t.execute("add", {"a": 0, "b": 1}),
           m.create({"messages": [{"role": "user", "content": "q1"}]}), t.execute("add", {"a": 1, "b": 1})]
    assert got == [{"text": "foreign 0"}, 1, {"text": "foreign 1"}, 2]
    assert (world.model, world.tools) == (0, 0)


def test_resume_attributes_are_on_node_spans(tmp_path):
    spans, *_ = record(tmp_path)
    nodes = [s for s in spans if (s.attributes or {}).get(sc.NODE_TYPE) in ("model", "tool")]
    assert len(nodes) == 13
    assert all(sc.RESUME_KEY in s.attributes and sc.RESUME_POSITION in s.attributes for s in nodes)
    assert {s.attributes[sc.RESUME_RESULT_ENCODING] for s in nodes} == {"json", "text"}


@pytest.mark.parametrize("run_id", ["r-epoch"])
def test_resumed_run_continues_the_same_tape_and_verifies(tmp_path, run_id):
    """A crash after two steps, then a resumed run under the same run id: a new epoch, not a break."""
    from otel_agenttape.tape.verification import verify_store

    journal = tmp_path / "journal.sqlite"
    cps = str(tmp_path / "checkpoints.jsonl")
    all_spans = []
    world = Counting()
    for attempt in range(2):
        exporter = InMemorySpanExporter()
        tape = otel_agenttape.setup(exporter=exporter, seal=True, seal_options={"checkpoint_file": cps})
        index = ResumeIndex(run_id, journal=journal)
        with tape.run(agent="a", run_id=run_id) as run:
            m = ResumableModelClient(world, index, run=run)
            for i in range(2 if attempt == 0 else 4):
                m.create({"messages": [{"role": "user", "content": f"q{i}"}]})
        tape.shutdown()
        all_spans += exporter.get_finished_spans()
    assert world.model == 4
    store = Store(None)
    store.write_traces([encode_spans(all_spans)])
    reports = verify_store(store.reader(), run=run_id, checkpoint_files=[cps])
    assert [(r.epoch, r.valid) for r in reports] == [(0, True), (1, True)], reports
    assert len(build_resume_index(store.reader(), run_id).entries("model")) == 4


@pytest.mark.parametrize("answer", ["Use the lookup tool.", {"text": "Use the lookup tool.", "id": 7}])
def test_a_client_returning_text_records_it_as_the_model_output(answer):
    """Plain text, or a dict with a text field: the node's output messages hold it (show, dataset)."""
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal=False)
    with tape.run(agent="a", run_id="text-run") as run:
        m = ResumableModelClient(lambda request: answer, ResumeIndex("text-run"), run=run)
        assert m.create({"messages": [{"role": "user", "content": "Paris?"}]}) == answer
    tape.shutdown()
    (node,) = [s for s in exporter.get_finished_spans() if (s.attributes or {}).get(sc.NODE_TYPE) == "model"]
    out = json.loads(node.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
    assert [p.get("content") for msg in out for p in msg["parts"] if p["type"] == "text"] == ["Use the lookup tool."]


def test_a_position_matched_model_call_refuses_another_prompt_or_model():
    """Spans without resume keys replay model answers by position, but never for a changed prompt."""
    from otel_agenttape.resume import DivergenceError

    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal=False)
    with tape.run(agent="a", run_id="plain") as run:
        with run.model_call("gpt-x", [{"role": "user", "content": "Pay the invoice"}]) as call:
            call.finish(raw={"text": "calling pay"})
    tape.shutdown()
    store = Store(None)
    store.write_traces([encode_spans(exporter.get_finished_spans())])

    def fresh():
        return ResumableModelClient(Counting(), build_resume_index(store.reader(), "plain", replay_only=True))

    with pytest.raises(DivergenceError, match="last user message"):
        fresh().create({"model": "gpt-x", "messages": [{"role": "user", "content": "Delete everything"}]})
    with pytest.raises(DivergenceError, match="recorded model"):
        fresh().create({"model": "other", "messages": [{"role": "user", "content": "Pay the invoice"}]})
    blocks = [{"role": "user", "content": [{"type": "text", "text": "Pay the invoice"}]}]  # Anthropic-style
    assert fresh().create({"model": "gpt-x", "messages": blocks}) == {"text": "calling pay"}
