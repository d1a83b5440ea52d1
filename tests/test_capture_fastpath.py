"""The cheap paths of capture give exactly what the SDK's public API would, and step aside whenever
something could tell the difference (limits, foreign processors, attribute-reading samplers)."""

from __future__ import annotations

import sys
import threading

import pytest
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

import otel_agenttape
from otel_agenttape import semconv as sc
from otel_agenttape.capture.fastspan import BareStart, set_valid_attributes
from otel_agenttape.capture.stats import CaptureStats


@pytest.fixture(autouse=True)
def no_sealing(monkeypatch):
    monkeypatch.setitem(sys.modules, "otel_agenttape.capture.sealing", None)


def _span(limits: SpanLimits | None = None):
    provider = TracerProvider(span_limits=limits or SpanLimits(max_span_attributes=1000))
    return provider.get_tracer("t").start_span("s", attributes={"a": "1", "b": 2})


VALUES = {"b": 3, "c": "text", "d": 1.5, "e": True, "f": ("x", "y")}


def test_valid_attributes_match_the_sdk_result():
    fast, slow = _span(), _span()
    set_valid_attributes(fast, dict(VALUES))
    slow.set_attributes(dict(VALUES))
    assert list(fast.attributes.items()) == list(slow.attributes.items())  # same values, same order
    assert fast.dropped_attributes == slow.dropped_attributes == 0
    fast.end()
    set_valid_attributes(fast, {"late": "x"})  # an ended span takes nothing, as in the SDK
    assert "late" not in fast.attributes


@pytest.mark.parametrize("limits", [SpanLimits(max_span_attributes=4), SpanLimits(max_span_attribute_length=2)])
def test_limits_go_through_the_sdk(limits):
    fast, slow = _span(limits), _span(limits)
    set_valid_attributes(fast, dict(VALUES))
    slow.set_attributes(dict(VALUES))
    assert dict(fast.attributes) == dict(slow.attributes)
    assert fast.dropped_attributes == slow.dropped_attributes


@pytest.mark.parametrize("value", [None, ["x"], {"k": "v"}, ("x", 1), object()])
def test_values_of_other_types_go_through_the_sdk(value):
    fast, slow = _span(), _span()
    set_valid_attributes(fast, {"v": value})
    slow.set_attributes({"v": value})
    assert dict(fast.attributes) == dict(slow.attributes)


class _StartSpy(SpanProcessor):
    def __init__(self) -> None:
        self.started: dict[str, dict] = {}

    def on_start(self, span, parent_context=None):
        self.started[span.name] = dict(span.attributes or {})


def _capture(tape):
    with tape.run(agent="a", run_id="r1") as run:
        with run.model_call(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.5) as call:
            call.finish(text="yo", usage={"prompt_tokens": 1, "completion_tokens": 2})
        with run.tool_call("t", {"q": 1}, call_id="c1") as tool:
            tool.result("r")


def _node_attrs(exporter):
    return {s.name: dict(s.attributes) for s in exporter.get_finished_spans() if s.name != "invoke_agent a"}


def test_bare_start_only_on_our_own_chain_and_same_result():
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter)
    assert tape.listener.spans.bare_start.ok()
    _capture(tape)
    tape.force_flush()
    bare = _node_attrs(exporter)
    exporter.clear()
    spy = _StartSpy()
    tape.tracer_provider.add_span_processor(spy)  # a processor that reads attributes at start
    assert not tape.listener.spans.bare_start.ok()
    _capture(tape)
    tape.force_flush()
    full = _node_attrs(exporter)
    tape.shutdown()
    assert spy.started["chat m"][sc.RUN_ID] and spy.started["execute_tool t"][sc.GEN_AI_TOOL_CALL_ID] == "c1"
    assert bare.keys() == full.keys()
    for name in bare:
        a = {k: v for k, v in bare[name].items() if k != sc.RECORD_ID}
        b = {k: v for k, v in full[name].items() if k != sc.RECORD_ID}
        assert a == b


class _AttributeSampler(Sampler):
    def __init__(self) -> None:
        self.seen: list[dict] = []

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        self.seen.append(dict(attributes or {}))
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "attribute sampler"


def test_attribute_reading_sampler_sees_node_attributes():
    sampler = _AttributeSampler()
    provider = TracerProvider(sampler=sampler)
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.instrument(provider, exporter=exporter)
    assert not BareStart(tape.listener.tracer).ok()
    _capture(tape)
    tape.shutdown()
    assert any(seen.get(sc.NODE_TYPE) == "model" for seen in sampler.seen)
    assert any(seen.get(sc.NODE_TYPE) == "tool" for seen in sampler.seen)


def test_other_processor_on_app_provider_disables_bare_start():
    provider = TracerProvider()
    app_exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(app_exporter))
    tape = otel_agenttape.instrument(provider, exporter=InMemorySpanExporter())
    assert not tape.listener.spans.bare_start.ok()
    tape.shutdown()


def test_counters_exact_under_threads():
    stats = CaptureStats()
    stats.set("checkpoints", 5)

    def work():
        for _ in range(5000):
            stats.incr("nodes_captured")
            stats.incr("checkpoints")
        stats.incr("redactions", 3)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = stats.snapshot()
    assert snap["nodes_captured"] == 20000 and snap["redactions"] == 12 and snap["checkpoints"] == 20005
    stats.set("checkpoints", 1)
    assert stats.get("checkpoints") == 1


def test_tape_now_and_uuid_replay_on_resume(tmp_path):
    from otel_agenttape.resume import ResumeIndex

    journal = tmp_path / "resume.sqlite"
    first = otel_agenttape.setup(exporter=False, resume_index=ResumeIndex("run-1", journal=str(journal)))
    recorded = [first.now(), first.uuid(), first.time_ns(), first.uuid()]
    first.resume_index.close()
    first.shutdown()
    resumed = otel_agenttape.setup(exporter=False, resume_index=ResumeIndex("run-1", journal=str(journal)))
    assert [resumed.now(), resumed.uuid(), resumed.time_ns(), resumed.uuid()] == recorded
    fresh = resumed.uuid()  # past the recorded ones: a new value
    assert fresh not in recorded
    resumed.resume_index.close()
    resumed.shutdown()
    plain = otel_agenttape.setup(exporter=False)
    assert plain.uuid() != plain.uuid() and plain.now() > 0
    plain.shutdown()
