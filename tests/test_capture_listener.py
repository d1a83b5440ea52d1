"""Baseline capture rules, fed as raw AgentEvents (the path any agent runtime uses)."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from otel_agenttape import semconv as sc
from otel_agenttape.capture.events import AgentEvent, EventType as T
from otel_agenttape.capture.listener import CaptureListener
from otel_agenttape.capture.sinks import InMemorySink
from otel_agenttape.capture.usage import ABSENT, parse_usage


@pytest.fixture
def env():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = InMemorySink()
    listener = CaptureListener(provider.get_tracer("otel_agenttape"), sinks=[sink])
    return listener, sink, exporter


def ev(kind, step=1, **kw):
    kw.setdefault("session_id", "s1")
    kw.setdefault("turn_id", "t1")
    return AgentEvent(kind, kw.pop("run_id", "r1"), step=step, **kw)


def spans_by_name(exporter):
    return {s.name: s for s in exporter.get_finished_spans()}


def test_streamed_text_concatenates_and_raw_keeps_latest_non_empty(env):
    listener, sink, exporter = env
    listener(ev(T.RUN_START, step=None, agent="planner"))
    listener(ev(T.MODEL_REQUEST, payload={"model": "m1", "messages": [{"role": "user", "content": "hi"}]}))
    listener(ev(T.MODEL_RESPONSE, text="Hel", payload={"chunk": 1}))
    listener(ev(T.MODEL_RESPONSE, text="lo", payload={}))  # empty raw: must not overwrite
    listener(ev(T.MODEL_RESPONSE, text=" wor", payload={"chunk": 3}))
    listener(ev(T.MODEL_RESPONSE, text="ld", payload=""))  # empty raw again
    listener(ev(T.MODEL_RESPONSE, text="", payload=None))
    assert sink.records() == []  # a model node is complete only at STEP_END
    listener(ev(T.STEP_END))
    [rec] = sink.records("model")
    assert rec.output_text == "Hello world"
    assert rec.outputs == {"chunk": 3}
    assert rec.model_id == "m1"
    assert rec.node_id == "model@r1|t1|1"
    span = spans_by_name(exporter)["chat m1"]
    assert span.kind is SpanKind.CLIENT
    assert span.attributes[sc.MODEL_OUTPUT_TEXT] == "Hello world"
    assert json.loads(span.attributes[sc.MODEL_RAW_OUTPUT]) == {"chunk": 3}
    texts = [(e.attributes[sc.EVENT_SEQ], e.attributes[sc.EVENT_SEGMENT]) for e in span.events
             if e.name == sc.EVENT_TEXT]
    assert texts == [(1, "Hel"), (2, "lo"), (3, " wor"), (4, "ld")]
    out = json.loads(span.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
    assert out[0]["role"] == "assistant" and out[0]["parts"] == [{"type": "text", "content": "Hello world"}]


def test_reasoning_joined_by_newlines_and_retries_counted_per_step(env):
    listener, sink, exporter = env
    listener(ev(T.MODEL_REQUEST, step=1, payload=[{"role": "user", "content": "q"}], model="m"))
    listener(ev(T.MODEL_RETRY, step=1, text="429"))
    listener(ev(T.MODEL_RETRY, step=1, text="503"))
    listener(ev(T.MODEL_REASONING, step=1, text="think a"))
    listener(ev(T.MODEL_REASONING, step=1, text="think b"))
    listener(ev(T.MODEL_RESPONSE, step=1, text="ok"))
    listener(ev(T.STEP_END, step=1))
    listener(ev(T.MODEL_REQUEST, step=2, payload=[{"role": "user", "content": "q2"}], model="m"))
    listener(ev(T.MODEL_RESPONSE, step=2, text="ok2"))
    listener(ev(T.STEP_END, step=2))
    first, second = sink.records("model")
    assert first.reasoning_text == "think a\nthink b"
    assert first.retry_count == 2 and second.retry_count == 0
    spans = [s for s in exporter.get_finished_spans() if s.attributes[sc.STEP] == 1]
    names = [e.name for e in spans[0].events]
    assert names == [sc.EVENT_RETRY, sc.EVENT_RETRY, sc.EVENT_REASONING, sc.EVENT_REASONING, sc.EVENT_TEXT]
    assert [e.attributes[sc.EVENT_SEQ] for e in spans[0].events] == [1, 2, 3, 4, 5]
    assert spans[0].events[0].attributes[sc.EVENT_REASON] == "429"
    assert spans[0].attributes[sc.MODEL_RETRY_COUNT] == 2
    assert spans[0].attributes[sc.MODEL_REASONING] == "think a\nthink b"


def test_retry_before_request_counts_for_that_step(env):
    listener, sink, _ = env
    listener(ev(T.MODEL_RETRY, step=4))
    listener(ev(T.MODEL_REQUEST, step=4, payload=[]))
    listener(ev(T.STEP_END, step=4))
    assert sink.records("model")[0].retry_count == 1


@pytest.mark.parametrize("raw, expected", [
    ({"usage": {"prompt_tokens": 11, "completion_tokens": 7}}, (11, 7, ABSENT, ABSENT)),
    ({"usage": {"promptTokens": 3, "completionTokens": 4}}, (3, 4, ABSENT, ABSENT)),
    ({"usage": {"input": 5, "output": 6}}, (5, 6, ABSENT, ABSENT)),
    # Anthropic: cache read/creation are added to input tokens
    ({"usage": {"input_tokens": 10, "output_tokens": 2, "cache_read_input_tokens": 5,
                "cache_creation_input_tokens": 3}}, (18, 2, 5, 3)),
    # OpenAI Responses API: cached tokens are a subset, not added
    ({"usage": {"input_tokens": 10, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 4}}},
     (10, 2, 4, ABSENT)),
    # Gemini
    ({"usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 9, "cachedContentTokenCount": 2}},
     (8, 9, 2, ABSENT)),
    # a real zero stays 0, an absent key is -1
    ({"usage": {"prompt_tokens": 0}}, (0, ABSENT, ABSENT, ABSENT)),
    ({"usage": {}}, (ABSENT, ABSENT, ABSENT, ABSENT)),
    ({"choices": []}, (ABSENT, ABSENT, ABSENT, ABSENT)),
    ("not a dict", (ABSENT, ABSENT, ABSENT, ABSENT)),
    ({"usage": {"prompt_tokens": True, "completion_tokens": "12"}}, (ABSENT, 12, ABSENT, ABSENT)),
])
def test_usage_shapes(raw, expected):
    u = parse_usage(raw)
    assert (u.input_tokens, u.output_tokens, u.cache_read_input_tokens, u.cache_write_input_tokens) == expected


def test_usage_on_span_absent_vs_zero(env):
    listener, sink, exporter = env
    listener(ev(T.MODEL_REQUEST, step=1, payload=[], model="a"))
    listener(ev(T.MODEL_RESPONSE, step=1, payload={"usage": {"prompt_tokens": 0, "completion_tokens": 0}}))
    listener(ev(T.STEP_END, step=1))
    listener(ev(T.MODEL_REQUEST, step=2, payload=[], model="b"))
    listener(ev(T.MODEL_RESPONSE, step=2, text="x"))
    listener(ev(T.STEP_END, step=2))
    zero, absent = sink.records("model")
    assert (zero.input_tokens, zero.output_tokens) == (0, 0)
    assert (absent.input_tokens, absent.output_tokens) == (-1, -1)
    spans = spans_by_name(exporter)
    assert spans["chat a"].attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 0
    assert sc.GEN_AI_USAGE_INPUT_TOKENS not in spans["chat b"].attributes


def test_streamed_anthropic_usage_merges_across_chunks(env):
    listener, sink, exporter = env
    listener(ev(T.MODEL_REQUEST, payload={"model": "claude", "messages": [], "system": "be brief"}))
    listener(ev(T.MODEL_RESPONSE, payload={"type": "message_start", "message": {
        "id": "msg_1", "model": "claude-x", "role": "assistant", "content": [],
        "usage": {"input_tokens": 20, "output_tokens": 1, "cache_read_input_tokens": 100}}}))
    listener(ev(T.MODEL_RESPONSE, text="hi", payload={"type": "content_block_delta"}))
    listener(ev(T.MODEL_RESPONSE, payload={"type": "message_delta", "usage": {"output_tokens": 42}}))
    listener(ev(T.STEP_END))
    [rec] = sink.records("model")
    assert (rec.input_tokens, rec.output_tokens) == (120, 42)
    assert rec.outputs == {"type": "message_delta", "usage": {"output_tokens": 42}}
    span = exporter.get_finished_spans()[0]
    assert span.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 100
    assert span.attributes[sc.GEN_AI_RESPONSE_MODEL] == "claude-x"
    assert json.loads(span.attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS]) == [{"type": "text", "content": "be brief"}]


def test_interleaved_parallel_tool_calls_pair_by_call_id(env):
    listener, sink, exporter = env
    listener(ev(T.TOOL_CALL, tool_name="search", call_id="a", payload={"q": "A"}))
    listener(ev(T.TOOL_CALL, tool_name="search", call_id="b", payload={"q": "B"}))
    listener(ev(T.TOOL_CALL, tool_name="fetch", call_id="c", payload={"u": "C"}))
    listener(ev(T.TOOL_RESULT, tool_name="search", call_id="b", payload="result B"))
    assert [r.call_id for r in sink.records("tool")] == ["b"]  # complete at TOOL_RESULT
    listener(ev(T.TOOL_RESULT, tool_name="fetch", call_id="c", payload={"body": "C"}))
    listener(ev(T.TOOL_RESULT, tool_name="search", call_id="a", payload="result A"))
    by_id = {r.call_id: r for r in sink.records("tool")}
    assert by_id["a"].inputs == {"q": "A"} and by_id["a"].outputs == "result A"
    assert by_id["b"].inputs == {"q": "B"} and by_id["b"].outputs == "result B"
    assert by_id["c"].outputs == {"body": "C"}
    assert by_id["a"].node_id == "tool@r1|t1|1|a"
    spans = {s.attributes[sc.GEN_AI_TOOL_CALL_ID]: s for s in exporter.get_finished_spans()}
    assert spans["a"].name == "execute_tool search" and spans["a"].kind is SpanKind.INTERNAL
    assert json.loads(spans["a"].attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS]) == {"q": "A"}
    assert spans["a"].attributes[sc.GEN_AI_TOOL_CALL_RESULT] == "result A"
    assert json.loads(spans["c"].attributes[sc.GEN_AI_TOOL_CALL_RESULT]) == {"body": "C"}


def test_missing_call_id_falls_back_to_tool_name_then_anon(env):
    listener, sink, _ = env
    listener(ev(T.TOOL_CALL, tool_name="calc", payload={"x": 1}))
    listener(ev(T.TOOL_CALL, payload={"y": 2}))
    listener(ev(T.TOOL_RESULT, payload="anon out"))
    listener(ev(T.TOOL_RESULT, tool_name="calc", payload="calc out"))
    recs = {r.node_id: r for r in sink.records("tool")}
    assert recs["tool@r1|t1|1|calc"].inputs == {"x": 1} and recs["tool@r1|t1|1|calc"].outputs == "calc out"
    assert recs["tool@r1|t1|1|anon"].inputs == {"y": 2} and recs["tool@r1|t1|1|anon"].outputs == "anon out"


def test_result_without_call_id_matches_call_with_id_by_tool_name(env):
    listener, sink, _ = env
    listener(ev(T.TOOL_CALL, tool_name="calc", call_id="k1", payload={"x": 1}))
    listener(ev(T.TOOL_RESULT, tool_name="calc", payload=3))
    [rec] = sink.records("tool")
    assert rec.inputs == {"x": 1} and rec.outputs == 3 and rec.call_id == "k1"


def test_orphan_tool_result_captured_without_input(env):
    listener, sink, exporter = env
    listener(ev(T.TOOL_RESULT, tool_name="inject", call_id="z", payload="external"))
    [rec] = sink.records("tool")
    assert rec.inputs is None and rec.outputs == "external" and rec.node_id == "tool@r1|t1|1|z"
    [span] = exporter.get_finished_spans()
    assert sc.GEN_AI_TOOL_CALL_ARGUMENTS not in span.attributes
    assert span.attributes[sc.GEN_AI_TOOL_CALL_RESULT] == "external"
    assert listener.stats.get("orphan_tool_results") == 1


def test_record_fields_and_times(env):
    listener, sink, _ = env
    listener(ev(T.MODEL_REQUEST, payload={"model": "gpt", "messages": []}, time_ns=1_000_000_000))
    listener(ev(T.MODEL_RESPONSE, text="x", time_ns=1_200_000_000))
    listener(ev(T.STEP_END, time_ns=1_500_000_000))
    listener(ev(T.TOOL_CALL, tool_name="t", call_id="c", payload=[1], time_ns=2_000_000_000))
    listener(ev(T.TOOL_RESULT, tool_name="t", call_id="c", payload=[2], time_ns=2_250_000_000))
    model, tool = sink.records()
    d = model.to_dict()
    for key in ("record_id", "run_id", "session_id", "turn_id", "step", "node_type", "node_id", "model_id",
                "inputs", "output_text", "outputs", "started_at_ms", "captured_at_ms", "duration_ms",
                "reasoning_text", "retry_count", "input_tokens", "output_tokens"):
        assert key in d
    assert (model.started_at_ms, model.captured_at_ms, model.duration_ms) == (1000, 1500, 500)
    assert tool.duration_ms == 250 and tool.node_type == "tool" and tool.session_id == "s1"
    assert model.record_id != tool.record_id


def test_run_span_and_error_status(env):
    listener, sink, exporter = env
    listener(ev(T.RUN_START, step=None, agent="coord", payload="plan a trip"))
    listener(ev(T.MODEL_REQUEST, payload={"model": "m", "messages": []}))
    listener(ev(T.TOOL_CALL, tool_name="book", call_id="1", payload={}))
    listener(ev(T.RUN_END, step=None, status="error", error="TimeoutError: slow"))
    spans = spans_by_name(exporter)
    run = spans["invoke_agent coord"]
    assert run.parent is None and run.kind is SpanKind.INTERNAL
    assert run.attributes[sc.RUN_STATUS] == "error" and run.status.status_code is StatusCode.ERROR
    assert run.attributes[sc.ERROR_TYPE] == "TimeoutError" and run.attributes[sc.NODE_TYPE] == "run"
    assert json.loads(run.attributes[sc.GEN_AI_INPUT_MESSAGES])[0]["parts"][0]["content"] == "plan a trip"
    # open nodes are flushed at run end and parented to the run span
    assert spans["chat m"].parent.span_id == run.context.span_id
    assert spans["execute_tool book"].status.status_code is StatusCode.ERROR
    assert len(sink.records()) == 2 and listener.pending() == {"runs": 0, "model_nodes": 0, "tool_nodes": 0}


def test_listener_never_raises(env):
    listener, sink, exporter = env

    class BadSink:
        def write(self, record):
            raise OSError("disk full")

    listener.add_sink(BadSink())
    listener(AgentEvent("NOT_A_TYPE", "r1"))  # type: ignore[arg-type]
    listener(ev(T.TOOL_CALL, tool_name="t", call_id="c", payload=object()))
    listener(ev(T.TOOL_RESULT, tool_name="t", call_id="c", payload={1, 2}))
    assert listener.stats.get("listener_errors") == 1
    assert listener.stats.get("sink_errors") == 1
    assert len(sink.records()) == 1


def test_second_request_in_same_step_closes_first(env):
    listener, sink, _ = env
    listener(ev(T.MODEL_REQUEST, payload={"model": "m", "messages": ["a"]}))
    listener(ev(T.MODEL_RESPONSE, text="one"))
    listener(ev(T.MODEL_REQUEST, payload={"model": "m", "messages": ["b"]}))
    listener(ev(T.MODEL_RESPONSE, text="two"))
    listener(ev(T.STEP_END))
    assert [r.output_text for r in sink.records("model")] == ["one", "two"]


def test_gemini_request_response_and_thought_tokens(env):
    listener, sink, exporter = env
    listener(ev(T.MODEL_REQUEST, model="gemini-2.5", provider="gcp.gemini", payload={"model": "gemini-2.5", "contents": [
        {"role": "user", "parts": [{"text": "hi"}, {"inlineData": {"mimeType": "image/jpeg", "data": "QUJD"}}]},
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"ok": True}}}]}]}))
    listener(ev(T.MODEL_RESPONSE, payload={
        "candidates": [{"content": {"role": "model", "parts": [{"text": "done"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 4, "thoughtsTokenCount": 6},
        "modelVersion": "gemini-2.5-flash-001"}))
    listener(ev(T.STEP_END))
    [rec] = sink.records("model")
    assert rec.output_text == "done" and (rec.input_tokens, rec.output_tokens) == (12, 10)
    span = exporter.get_finished_spans()[0]
    msgs = json.loads(span.attributes[sc.GEN_AI_INPUT_MESSAGES])
    assert msgs[0]["parts"][1] == {"type": "blob", "modality": "image", "mime_type": "image/jpeg", "content": "QUJD"}
    assert msgs[1] == {"role": "assistant", "parts": [{"type": "tool_call", "name": "f", "arguments": {"a": 1}}]}
    assert msgs[2]["parts"] == [{"type": "tool_call_response", "id": "f", "response": {"ok": True}}]
    assert span.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert span.attributes[sc.GEN_AI_RESPONSE_MODEL] == "gemini-2.5-flash-001"
    assert span.attributes[sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] == 6


def test_records_without_tracer():
    sink = InMemorySink()
    listener = CaptureListener(None, sinks=[sink])
    listener(ev(T.MODEL_REQUEST, payload=[{"role": "user", "content": "x"}], model="m"))
    listener(ev(T.MODEL_RESPONSE, text="y", payload={"usage": {"prompt_tokens": 1, "completion_tokens": 1}}))
    listener(ev(T.STEP_END))
    [rec] = sink.records("MODEL")
    assert rec.output_text == "y" and rec.trace_id is None and rec.input_tokens == 1


def test_attribute_order_of_node_spans_is_fixed(env):
    # Exported bytes (and what a tape seals) follow the attribute order: operation attributes, node
    # identity, request parameters, the caller's extras, content; completion adds its own after them.
    listener, _, exporter = env
    listener(ev(T.RUN_START, step=None, agent="a"))
    listener(ev(T.MODEL_REQUEST, payload={"model": "m", "messages": [], "max_tokens": 5, "temperature": 0.1},
                attributes={"x": 1}))
    listener(ev(T.STEP_END))
    listener(ev(T.TOOL_CALL, tool_name="t", call_id="c", payload={"q": 1}))
    listener(ev(T.TOOL_RESULT, tool_name="t", call_id="c", error="KeyError: q", payload=None))
    listener(ev(T.RUN_END, step=None))
    spans = spans_by_name(exporter)
    identity = [sc.GEN_AI_AGENT_NAME, sc.RUN_ID, sc.SESSION_ID, sc.TURN_ID, sc.STEP, sc.NODE_TYPE, sc.NODE_ID,
                sc.RECORD_ID]
    assert list(spans["chat m"].attributes)[:15] == [
        sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_REQUEST_MODEL, *identity, sc.GEN_AI_REQUEST_MAX_TOKENS,
        sc.GEN_AI_REQUEST_TEMPERATURE, "x", sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_RESPONSE_MODEL]
    assert list(spans["execute_tool t"].attributes) == [
        sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_TOOL_NAME, sc.GEN_AI_TOOL_CALL_ID, sc.GEN_AI_TOOL_TYPE, *identity,
        sc.GEN_AI_TOOL_CALL_ARGUMENTS, sc.TOOL_ERROR, sc.ERROR_TYPE]
