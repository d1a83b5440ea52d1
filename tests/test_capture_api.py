"""The context-manager API: nesting, errors, async, message conversion, propagation, sinks, sealing hook."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import types

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import otel_agenttape
from otel_agenttape import semconv as sc
from otel_agenttape.capture.pipeline import ForwardingSpanProcessor
from otel_agenttape.capture.redact import REDACTED, REDACTION_FAILED
from otel_agenttape.capture.sinks import JsonlSink


@pytest.fixture
def no_sealing(monkeypatch):
    # None in sys.modules makes the import fail, as when the sealing module is absent.
    monkeypatch.setitem(sys.modules, "otel_agenttape.capture.sealing", None)


@pytest.fixture
def cap(no_sealing):
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, memory=True)
    yield tape, exporter
    tape.shutdown()


def finished(tape, exporter):
    assert tape.force_flush()
    return exporter.get_finished_spans()


def by_name(spans):
    return {s.name: s for s in spans}


def test_run_model_tool_tree(cap):
    tape, exporter = cap
    with tape.run(agent="planner", session_id="sess") as run:
        with run.model_call(model="gpt-4o", provider="openai", max_tokens=50, messages=[
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "look"},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                {"role": "tool", "tool_call_id": "c0", "content": "done"}]) as call:
            call.reasoning("hmm")
            call.delta("A")
            call.delta("B")
            call.finish(usage={"prompt_tokens": 3, "completion_tokens": 2}, finish_reason="tool_calls",
                        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}])
        assert call.text == "AB"
        with run.tool_call("search", {"q": "x"}, call_id="c1") as tool:
            tool.result({"hits": 2})
        run.set_output("final answer")
    spans = by_name(finished(tape, exporter))
    root, chat, tool_span = spans["invoke_agent planner"], spans["chat gpt-4o"], spans["execute_tool search"]
    assert chat.parent.span_id == root.context.span_id == tool_span.parent.span_id
    assert chat.context.trace_id == root.context.trace_id
    assert chat.kind is SpanKind.CLIENT and tool_span.kind is SpanKind.INTERNAL
    assert root.attributes[sc.RUN_STATUS] == "completed"
    assert root.attributes[sc.GEN_AI_CONVERSATION_ID] == "sess"
    assert json.loads(root.attributes[sc.GEN_AI_OUTPUT_MESSAGES]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "final answer"}]}]
    msgs = json.loads(chat.attributes[sc.GEN_AI_INPUT_MESSAGES])
    assert msgs[0] == {"role": "system", "parts": [{"type": "text", "content": "sys"}]}
    assert msgs[1]["parts"][1] == {"type": "blob", "modality": "image", "content": "AAA", "mime_type": "image/png"}
    assert msgs[2]["parts"] == [{"type": "tool_call", "id": "c0", "name": "f", "arguments": {"a": 1}}]
    assert msgs[3] == {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c0", "response": "done"}]}
    out = json.loads(chat.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
    assert out == [{"role": "assistant", "finish_reason": "tool_call", "parts": [
        {"type": "reasoning", "content": "hmm"}, {"type": "text", "content": "AB"},
        {"type": "tool_call", "id": "c1", "name": "search", "arguments": {}}]}]
    assert chat.attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] == 50
    assert chat.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert chat.attributes[sc.NODE_TYPE] == "model" and chat.attributes[sc.STEP] == 1
    assert tool_span.attributes[sc.STEP] == 1 and tool_span.attributes[sc.NODE_TYPE] == "tool"
    model_rec, tool_rec = tape.memory.records("model")[0], tape.memory.records("tool")[0]
    assert model_rec.input_tokens == 3 and tool_rec.outputs == {"hits": 2}


def test_anthropic_messages_and_system(cap):
    tape, exporter = cap
    with tape.run(agent="a") as run:
        with run.model_call(model="claude", provider="anthropic", system="You are terse.", messages=[
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "use tool"},
                                                  {"type": "tool_use", "id": "tu1", "name": "wx", "input": {"c": "P"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "rain"}]}],
                tools=[{"name": "wx", "description": "weather", "input_schema": {"type": "object"}}]) as call:
            call.finish(raw={"id": "msg_1", "model": "claude-3", "role": "assistant", "stop_reason": "end_turn",
                             "content": [{"type": "text", "text": "Rainy."}],
                             "usage": {"input_tokens": 7, "output_tokens": 3, "cache_creation_input_tokens": 2}})
    chat = by_name(finished(tape, exporter))["chat claude"]
    msgs = json.loads(chat.attributes[sc.GEN_AI_INPUT_MESSAGES])
    assert msgs[1]["parts"] == [{"type": "reasoning", "content": "use tool"},
                                {"type": "tool_call", "id": "tu1", "name": "wx", "arguments": {"c": "P"}}]
    assert msgs[2]["parts"] == [{"type": "tool_call_response", "id": "tu1", "response": "rain"}]
    assert json.loads(chat.attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS]) == [{"type": "text", "content": "You are terse."}]
    assert json.loads(chat.attributes[sc.GEN_AI_TOOL_DEFINITIONS])[0]["parameters"] == {"type": "object"}
    assert json.loads(chat.attributes[sc.GEN_AI_OUTPUT_MESSAGES])[0]["parts"] == [{"type": "text", "content": "Rainy."}]
    assert chat.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert chat.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 9
    assert chat.attributes[sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS] == 2
    assert chat.attributes[sc.GEN_AI_RESPONSE_ID] == "msg_1"


def test_exception_marks_node_and_run_error_and_reraises(cap):
    tape, exporter = cap
    with pytest.raises(KeyError):
        with tape.run(agent="x") as run:
            with run.tool_call("lookup", {"k": 1}, call_id="c"):
                raise KeyError("k")
    spans = by_name(finished(tape, exporter))
    tool = spans["execute_tool lookup"]
    assert tool.status.status_code is StatusCode.ERROR and "KeyError" in tool.attributes[sc.TOOL_ERROR]
    assert sc.GEN_AI_TOOL_CALL_RESULT not in tool.attributes
    run_span = spans["invoke_agent x"]
    assert run_span.attributes[sc.RUN_STATUS] == "error" and run_span.status.status_code is StatusCode.ERROR
    assert run_span.attributes[sc.ERROR_TYPE] == "KeyError"
    assert tape.memory.records("tool")[0].error.startswith("KeyError")


def test_model_error_marks_node(cap):
    tape, exporter = cap
    with pytest.raises(RuntimeError):
        with tape.run(agent="x") as run:
            with run.model_call(model="m", messages=[]) as call:
                call.retry(TimeoutError("t"))
                raise RuntimeError("provider down")
    chat = by_name(finished(tape, exporter))["chat m"]
    assert chat.status.status_code is StatusCode.ERROR and chat.attributes[sc.ERROR_TYPE] == "RuntimeError"
    assert chat.attributes[sc.MODEL_RETRY_COUNT] == 1


def test_nested_child_runs(cap):
    tape, exporter = cap
    with tape.run(agent="coordinator", session_id="S") as coord:
        with coord.child(agent="researcher") as child:
            with child.model_call(model="m", messages="find") as call:
                call.delta("found")
        with tape.run(agent="writer") as implicit_child:
            pass
    spans = by_name(finished(tape, exporter))
    c, r, w = spans["invoke_agent coordinator"], spans["invoke_agent researcher"], spans["invoke_agent writer"]
    assert r.parent.span_id == c.context.span_id and w.parent.span_id == c.context.span_id
    assert r.attributes[sc.PARENT_RUN_ID] == coord.run_id == w.attributes[sc.PARENT_RUN_ID]
    assert r.attributes[sc.SESSION_ID] == "S" == w.attributes[sc.SESSION_ID]
    assert spans["chat m"].parent.span_id == r.context.span_id
    assert spans["chat m"].attributes[sc.RUN_ID] == child.run_id
    assert otel_agenttape.current_run() is None
    assert implicit_child.status == "completed"


async def test_async_parallel_tools_without_ids(cap):
    tape, exporter = cap

    async def use_tool(run, n):
        async with run.tool_call("search", {"n": n}) as tool:
            await asyncio.sleep(0.01 * (3 - n))  # finish in reverse order
            assert otel_agenttape.current_run() is run
            return tool.result(f"r{n}")

    async with tape.run(agent="async") as run:
        async with run.model_call(model="m", messages=[]) as call:
            call.delta("go")
        results = await asyncio.gather(*(use_tool(run, n) for n in range(3)))
    assert results == ["r0", "r1", "r2"]
    recs = tape.memory.records("tool")
    assert {(r.inputs["n"], r.outputs) for r in recs} == {(0, "r0"), (1, "r1"), (2, "r2")}
    spans = [s for s in finished(tape, exporter) if s.name == "execute_tool search"]
    assert len(spans) == 3
    assert all(s.attributes[sc.STEP] == 1 for s in spans)
    assert len({s.attributes[sc.NODE_ID] for s in spans}) == 3


def test_cross_process_child_links_to_parent_run(cap):
    tape, exporter = cap
    with tape.run(agent="parent", session_id="S1") as parent:
        carrier = parent.inject()
        assert "traceparent" in carrier and "baggage" in carrier
    # what the child process does with the headers it received
    headers = {k.title(): v for k, v in carrier.items()}
    with tape.run(agent="child", parent=headers) as child:
        pass
    spans = by_name(finished(tape, exporter))
    p, c = spans["invoke_agent parent"], spans["invoke_agent child"]
    assert c.attributes[sc.PARENT_RUN_ID] == parent.run_id and child.session_id == "S1"
    assert c.parent is None and c.context.trace_id != p.context.trace_id
    assert [(l.context.trace_id, l.context.span_id) for l in c.links] == [(p.context.trace_id, p.context.span_id)]
    with tape.run(agent="child2", parent=carrier, same_trace=True):
        pass
    c2 = by_name(finished(tape, exporter))["invoke_agent child2"]
    assert c2.parent.span_id == p.context.span_id and c2.context.trace_id == p.context.trace_id


def test_redaction_builtin_and_callable(no_sealing):
    exporter = InMemorySpanExporter()
    secret = "sk-proj-ABCDEFGHIJKLMNOPQRSTUV123"
    tape = otel_agenttape.setup(exporter=exporter, redact=[True, lambda s: s.replace("Paris", "<city>")])
    with tape.run(agent="r") as run:
        with run.model_call(model="m", messages=[{"role": "user", "content": f"key {secret} mail a.b@example.com"}]) as call:
            call.delta("Authorization: Bearer abcdefghijklmnop")
        with run.tool_call("t", {"city": "Paris"}, call_id="1") as tool:
            tool.result("write to bob@corp.io")
    spans = by_name(finished(tape, exporter))
    chat, tool_span = spans["chat m"], spans["execute_tool t"]
    text = chat.attributes[sc.GEN_AI_INPUT_MESSAGES]
    assert secret not in text and "a.b@example.com" not in text and REDACTED in text
    assert "abcdefghijklmnop" not in chat.events[0].attributes[sc.EVENT_SEGMENT]
    assert "abcdefghijklmnop" not in chat.attributes[sc.MODEL_OUTPUT_TEXT]
    assert tool_span.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] == '{"city":"<city>"}'
    assert tool_span.attributes[sc.GEN_AI_TOOL_CALL_RESULT] == f"write to {REDACTED}"
    assert tape.stats()["redactions"] >= 4
    # a span from another instrumentation on the same provider is redacted before export too
    other = tape.tracer_provider.get_tracer("someone.else")
    with other.start_as_current_span("chat x") as s:
        s.set_attribute(sc.GEN_AI_INPUT_MESSAGES, f"mail me at c@d.org, key {secret}")
        s.set_attribute("http.url", "c@d.org")  # not content: left alone
    foreign = by_name(finished(tape, exporter))["chat x"]
    assert foreign.attributes[sc.GEN_AI_INPUT_MESSAGES] == f"mail me at {REDACTED}, key {REDACTED}"
    assert foreign.attributes["http.url"] == "c@d.org"
    tape.shutdown()


def test_failing_redactor_counts_and_withholds(no_sealing):
    exporter = InMemorySpanExporter()

    def boom(text):
        raise ValueError("bad regex day")

    tape = otel_agenttape.setup(exporter=exporter, redact=boom)
    with tape.run(agent="r") as run:
        with run.tool_call("t", "secret input", call_id="1") as tool:
            tool.result("secret output")
    span = by_name(finished(tape, exporter))["execute_tool t"]
    assert span.attributes[sc.GEN_AI_TOOL_CALL_RESULT] == REDACTION_FAILED
    assert tape.stats()["redactor_errors"] == 2
    tape.shutdown()


def test_cut_payload_is_marked_with_length_and_sha256(no_sealing):
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, max_payload_chars=100)
    big = "é" * 1000
    with tape.run(agent="r") as run:
        with run.tool_call("t", None, call_id="1") as tool:
            tool.result(big)
    span = by_name(finished(tape, exporter))["execute_tool t"]
    key = sc.GEN_AI_TOOL_CALL_RESULT
    assert span.attributes[key] == big[:100]
    assert span.attributes[key + sc.PAYLOAD_LENGTH_SUFFIX] == len(big.encode())
    assert span.attributes[key + sc.PAYLOAD_SHA256_SUFFIX] == hashlib.sha256(big.encode()).hexdigest()
    assert span.attributes[sc.TRUNCATED] == (key,)
    assert tape.stats()["payloads_truncated"] == 1
    tape.shutdown()


def test_sdk_length_limit_on_existing_provider_is_marked(no_sealing):
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    provider = TracerProvider(span_limits=SpanLimits(max_attribute_length=50))
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.instrument(provider, exporter=exporter)
    with tape.run(agent="r") as run:
        with run.tool_call("t", None, call_id="1") as tool:
            tool.result("x" * 80)
    span = by_name(finished(tape, exporter))["execute_tool t"]
    assert span.attributes[sc.GEN_AI_TOOL_CALL_RESULT] == "x" * 50
    assert span.attributes[sc.GEN_AI_TOOL_CALL_RESULT + sc.PAYLOAD_LENGTH_SUFFIX] == 80
    tape.shutdown()


def test_raised_limits_keep_many_events(cap):
    tape, exporter = cap
    with tape.run(agent="s") as run:
        with run.model_call(model="m", messages=[]) as call:
            for i in range(1000):
                call.delta(f"{i},")
    chat = by_name(finished(tape, exporter))["chat m"]
    assert len(chat.events) == 1000 and chat.dropped_events == 0
    assert tape.stats()["dropped_events"] == 0


def test_jsonl_sink_appends_one_record_per_line(tmp_path, no_sealing):
    path = tmp_path / "nodes.jsonl"
    for round_ in range(2):
        tape = otel_agenttape.setup(exporter=False, jsonl_path=path)
        with tape.run(agent="j", run_id=f"run{round_}") as run:
            with run.model_call(model="m", messages="hi") as call:
                call.finish(text="hello", usage={"input_tokens": 1})
            with run.tool_call("t", {"a": 1}, call_id="c") as tool:
                tool.result(b"\x00bytes")
        tape.shutdown()
    lines = path.read_text().splitlines()
    assert len(lines) == 4
    rows = [json.loads(line) for line in lines]
    assert [r["node_type"] for r in rows] == ["model", "tool", "model", "tool"]
    assert rows[0]["output_text"] == "hello" and rows[0]["input_tokens"] == 1 and rows[0]["output_tokens"] == -1
    assert rows[2]["run_id"] == "run1" and rows[1]["inputs"] == {"a": 1}
    assert JsonlSink(path).read()[3]["node_id"] == "tool@run1|1|1|c"


def test_sealing_processor_is_wrapped_when_available(monkeypatch):
    seen = []

    class FakeSealing(ForwardingSpanProcessor):
        def __init__(self, next_processor, **opts):
            super().__init__(next_processor)
            seen.append(opts)

        def on_end(self, span):
            if span.name.startswith("execute_tool bad"):
                raise RuntimeError("seal failure")
            self.next_processor.on_end(span)

    module = types.ModuleType("otel_agenttape.capture.sealing")
    module.SealingSpanProcessor = FakeSealing
    monkeypatch.setitem(sys.modules, "otel_agenttape.capture.sealing", module)
    exporter = InMemorySpanExporter()
    tape = otel_agenttape.setup(exporter=exporter, seal_options={"tape_id": "T"})
    with tape.run(agent="s") as run:
        with run.tool_call("bad", None, call_id="1"):
            pass
    names = {s.name for s in finished(tape, exporter)}
    assert seen == [{"tape_id": "T"}]
    assert names == {"invoke_agent s", "execute_tool bad"}  # a failed seal still exports the span
    stats = tape.stats()
    assert stats["sealing_active"] == 1 and stats["sealing_unavailable"] == 0 and stats["sealing_errors"] == 1
    tape.shutdown()


def test_seal_options_typo_raises_at_setup():
    # the real sealing processor: a misspelt keyword must not silently turn sealing off
    with pytest.raises(TypeError, match="checkpoint_evry"):
        otel_agenttape.setup(exporter=InMemorySpanExporter(), seal_options={"checkpoint_evry": 5})
    with pytest.raises(TypeError, match="max_queue_sizee"):
        otel_agenttape.setup(exporter=InMemorySpanExporter(), queue_options={"max_queue_sizee": 5})


def test_unreadable_signing_key_warns_and_counts(monkeypatch, tmp_path, caplog):
    missing = tmp_path / "nope.key"
    monkeypatch.setenv("AGENTTAPE_SIGNING_KEY", str(missing))
    with caplog.at_level("WARNING", logger="otel_agenttape.capture.pipeline"):
        tape = otel_agenttape.setup(exporter=InMemorySpanExporter())
    try:
        stats = tape.stats()
        assert stats["sealing_unavailable"] == 1 and stats["sealing_active"] == 0
        warnings = [r for r in caplog.records if r.name == "otel_agenttape.capture.pipeline"]
        assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
        assert "sealing is off" in warnings[0].getMessage() and str(missing) in warnings[0].getMessage()
    finally:
        tape.shutdown()


def test_unsealed_when_sealing_module_missing(cap):
    tape, _ = cap
    assert tape.stats()["sealing_unavailable"] == 1 and tape.stats()["sealing_active"] == 0


def test_failing_exporter_does_not_touch_agent_result(no_sealing):
    class Failing(InMemorySpanExporter):
        def __init__(self, mode):
            super().__init__()
            self.mode = mode

        def export(self, spans):
            if self.mode == "raise":
                raise ConnectionError("collector gone")
            return SpanExportResult.FAILURE

    for mode, counter in (("raise", "exporter_exceptions"), ("fail", "export_failures")):
        tape = otel_agenttape.setup(exporter=Failing(mode))

        def agent():
            with tape.run(agent="f") as run:
                with run.tool_call("t", {"x": 1}, call_id="1") as tool:
                    return tool.result(41 + 1)

        assert agent() == 42
        tape.force_flush()
        stats = tape.stats()
        assert stats[counter] >= 1 and stats["spans_export_failed"] == 2 and stats["spans_exported"] == 0
        tape.shutdown()


def test_import_is_light():
    import subprocess

    code = "import sys, otel_agenttape; print(any(m.startswith('opentelemetry.sdk') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_metadata_events(cap):
    tape, exporter = cap
    with tape.run(agent="m") as run:
        run.metadata(phase="plan")
        with run.model_call(model="m", messages=[]) as call:
            call.delta("a")
            call.metadata(cache="hit", attempt=2, extra={"k": 1})
    spans = by_name(finished(tape, exporter))
    [run_event] = spans["invoke_agent m"].events
    assert run_event.name == sc.EVENT_METADATA and run_event.attributes["phase"] == "plan"
    events = spans["chat m"].events
    assert [e.name for e in events] == [sc.EVENT_TEXT, sc.EVENT_METADATA]
    meta = events[1].attributes
    assert meta[sc.EVENT_SEQ] == 2 and meta["cache"] == "hit" and meta["attempt"] == 2
    assert json.loads(meta["extra"]) == {"k": 1}


def test_redaction_also_applies_to_local_node_records(tmp_path):
    import json as _json

    import otel_agenttape

    path = tmp_path / "nodes.jsonl"
    tape = otel_agenttape.setup(exporter=False, jsonl_path=str(path), memory=True, redact=True)
    with tape.run(agent="a") as run:
        with run.model_call("m", [{"role": "user", "content": "mail alice@example.com"}]) as call:
            call.delta("key sk-abcdefghijklmnopqrstuvwxyz123456 used")
        with run.tool_call("send", {"to": "bob@example.com"}) as tool:
            tool.result("sent to bob@example.com")
    tape.shutdown()
    text = path.read_text()
    assert "alice@example.com" not in text and "bob@example.com" not in text
    assert "sk-abcdefghijklmnopqrstuvwxyz123456" not in text
    records = [_json.loads(line) for line in text.splitlines()]
    assert {r["node_type"] for r in records} == {"model", "tool"}
    assert all("example.com" not in repr(r) for r in tape.memory.records("model"))
