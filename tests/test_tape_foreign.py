"""Tapes rebuilt from other instrumentations' spans.

Real packages (official GenAI openai instrumentation, OpenInference, OpenLLMetry) drive the real
`openai` client against a fake OpenAI-compatible server on 127.0.0.1 and export OTLP to the real
receiver; hand-built spans cover each convention's other shapes (structured values, log events,
flattened and legacy indexed attributes, agent/tool/workflow spans).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from otel_agenttape.cli import main
from otel_agenttape.store.writer import Store
from otel_agenttape.tape import export_dataset, reconstruct, reconstruct_tree, replay_model_mock
from otel_agenttape.tape.read import Tapes
from tape_agents import start_server
from tape_fakeopenai import FakeOpenAI

HERE = Path(__file__).parent
WEATHER = {"city": "Paris", "temp": 57}


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    server = start_server(str(tmp_path_factory.mktemp("foreign") / "tape.duckdb"))
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("convention", "mode"),
    [("genai", ""), ("genai-events", ""), ("openinference", ""), ("openllmetry", ""), ("openinference", "stream")],
)
def test_real_instrumentation_through_the_receiver(receiver, convention, mode, capsys):
    pytest.importorskip("openai")
    pytest.importorskip({
        "genai": "opentelemetry.instrumentation.genai.openai",
        "genai-events": "opentelemetry.instrumentation.genai.openai",
        "openinference": "openinference.instrumentation.openai",
        "openllmetry": "opentelemetry.instrumentation.openai",
    }[convention])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    with FakeOpenAI() as fake:
        proc = subprocess.run(
            [sys.executable, str(HERE / "tape_foreign_app.py"), convention, receiver.url, fake.base_url, mode],
            env=env, capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(fake.requests) == 2
    trace_id = proc.stdout.strip().splitlines()[-1]
    assert receiver.wait_idle(30)
    reader = receiver.store.reader()
    run = reconstruct(reader, trace_id)  # no agenttape run span: the trace is the run
    assert run.run_id == trace_id and run.status == "completed"
    assert run.agent == f"foreign-{convention}"  # the service name stands in for an agent name
    assert [(m.role, m.content()) for m in run.input] == [("system", "You are terse."), ("user", "Weather in Paris?")]
    assert run.output == "It is 57F in Paris."
    assert [(t.name, t.arguments, t.result, t.call_id) for t in run.tools] == [
        ("get_weather", {"city": "Paris"}, WEATHER, "call_1")]
    assert (run.usage.input_tokens, run.usage.output_tokens) == (23, 10)
    assert run.models == ["gpt-test"]
    assert len(run.model_nodes) == 2
    assert run.model_nodes[1].tool_definitions[0]["name"] == "get_weather"
    assert [m.role for m in run.model_nodes[1].prompt] == ["system", "user", "assistant", "tool"]
    assert replay_model_mock(run.model_nodes[1]).output is not None
    # the same trace appears among the runs a dataset export reads
    assert trace_id in {r.run_id for r in Tapes(reader, owns=False).runs().runs}
    # and `agenttape replay TRACE_ID` shows it (through the serving receiver's query endpoint)
    capsys.readouterr()
    assert main(["replay", trace_id, "--db", receiver.db, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["output"] == run.output and doc["tools"][0]["result"] == WEATHER


def _spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "handmade"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("handmade"), exporter


def _store(exporter, logs=None):
    store = Store(None)
    store.write_traces([encode_spans(exporter.get_finished_spans())])
    if logs is not None:
        store.write_logs([encode_logs(logs.get_finished_logs())])
    return store


def _tid(span) -> str:
    return format(span.get_span_context().trace_id, "032x")


def test_genai_structured_values_agent_and_tool_spans():
    tracer, exporter = _spans()
    with tracer.start_as_current_span("invoke_agent Planner", attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "Planner",
        "gen_ai.conversation.id": "conv-9",
    }) as agent:
        with tracer.start_as_current_span("chat m1", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "acme", "gen_ai.request.model": "m1",
            # structured (kvlist/array) values, as SDK >= 1.45 exports them
            "gen_ai.system_instructions": [{"type": "text", "content": "Plan carefully."}],
            "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "Trip to Rome"}]}],
            "gen_ai.output.messages": [{"role": "assistant", "finish_reason": "tool_call", "parts": [
                {"type": "reasoning", "content": "need weather"},
                {"type": "tool_call", "id": "t1", "name": "weather", "arguments": {"city": "Rome"}}]}],
            "gen_ai.usage.input_tokens": 7, "gen_ai.usage.output_tokens": 2,
        }):
            pass
        with tracer.start_as_current_span("execute_tool weather", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "weather", "gen_ai.tool.call.id": "t1",
            "gen_ai.tool.call.arguments": '{"city": "Rome"}', "gen_ai.tool.call.result": '{"temp": 70}',
        }):
            pass
        with tracer.start_as_current_span("chat m1", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m1",
            "gen_ai.input.messages": json.dumps([
                {"role": "user", "parts": [{"type": "text", "content": "Trip to Rome"}]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "t1", "result": {"temp": 70}}]}]),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                {"type": "text", "content": "Go, it is warm."}]}]),
        }):
            pass
    run = reconstruct(_store(exporter).reader(), _tid(agent))
    assert run.agent == "Planner" and run.session_id == "conv-9"
    assert [(m.role, m.content()) for m in run.input] == [("system", "Plan carefully."), ("user", "Trip to Rome")]
    assert run.output == "Go, it is warm."
    assert [(t.name, t.arguments, t.result, t.executed) for t in run.tools] == [
        ("weather", {"city": "Rome"}, {"temp": 70}, True)]
    assert run.model_nodes[0].reasoning == "need weather"
    # the older "result" spelling of tool_call_response is read as "response"
    assert run.model_nodes[1].input_messages[1].tool_responses[0]["response"] == {"temp": 70}


def test_openinference_agent_llm_tool_spans():
    tracer, exporter = _spans()
    with tracer.start_as_current_span("agent", attributes={
        "openinference.span.kind": "AGENT", "agent.name": "Scout", "session.id": "s-1",
        "input.value": "Find a cafe", "output.value": "Cafe Roma",
    }) as agent:
        with tracer.start_as_current_span("llm", attributes={
            "openinference.span.kind": "LLM", "llm.model_name": "oi-model",
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.contents.0.message_content.type": "text",
            "llm.input_messages.0.message.contents.0.message_content.text": "Find a cafe",
            "llm.input_messages.0.message.contents.1.message_content.type": "image",
            "llm.input_messages.0.message.contents.1.message_content.image.image.url": "https://x/map.png",
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.tool_calls.0.tool_call.id": "c9",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "search",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"q": "cafe"}',
            "llm.token_count.prompt": 4, "llm.token_count.completion": 1,
        }):
            pass
        with tracer.start_as_current_span("search", attributes={
            "openinference.span.kind": "TOOL", "tool.name": "search", "tool.id": "c9",
            "input.value": '{"q": "cafe"}', "output.value": "Cafe Roma",
        }):
            pass
    run = reconstruct(_store(exporter).reader(), _tid(agent))
    assert run.agent == "Scout" and run.session_id == "s-1"
    assert [(m.role, m.content()) for m in run.input] == [("user", "Find a cafe")]
    assert run.output == "Cafe Roma"
    assert [(t.name, t.arguments, t.result, t.call_id) for t in run.tools] == [
        ("search", {"q": "cafe"}, "Cafe Roma", "c9")]
    parts = run.model_nodes[0].input_messages[0].parts
    assert parts[1] == {"type": "uri", "modality": "image", "uri": "https://x/map.png"}
    assert (run.usage.input_tokens, run.usage.output_tokens) == (4, 1)


def test_openllmetry_legacy_indexed_attributes_and_traceloop_entities():
    tracer, exporter = _spans()
    with tracer.start_as_current_span("trip.workflow", attributes={
        "traceloop.span.kind": "workflow", "traceloop.entity.name": "trip",
    }) as root:
        with tracer.start_as_current_span("openai.chat", attributes={
            "llm.request.type": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-legacy",
            "gen_ai.prompt.name": "trip-template",  # a prompt template name, not a message
            "gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": "Be brief.",
            "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": "Book Rome",
            "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.finish_reason": "tool_calls",
            "gen_ai.completion.0.tool_calls.0.id": "b1", "gen_ai.completion.0.tool_calls.0.name": "book",
            "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Rome"}',
            "gen_ai.usage.prompt_tokens": 9, "gen_ai.usage.completion_tokens": 3,
            "llm.request.functions.0.name": "book", "llm.request.functions.0.description": "Book a trip",
            "llm.request.functions.0.parameters": '{"type": "object"}',
        }):
            pass
        with tracer.start_as_current_span("book.tool", attributes={
            "traceloop.span.kind": "tool", "traceloop.entity.name": "book",
            "traceloop.entity.input": json.dumps({"args": [], "kwargs": {"city": "Rome"}}),
            "traceloop.entity.output": json.dumps({"booked": True}),
        }):
            pass
        with tracer.start_as_current_span("openai.chat", attributes={
            "llm.request.type": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-legacy",
            "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "Book Rome",
            "gen_ai.prompt.1.role": "tool", "gen_ai.prompt.1.tool_call_id": "b1",
            "gen_ai.prompt.1.content": '{"booked": true}',
            "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "Booked.",
        }):
            pass
    store = _store(exporter)
    run = reconstruct(store.reader(), _tid(root))
    assert [(m.role, m.content()) for m in run.input] == [("system", "Be brief."), ("user", "Book Rome")]
    assert run.output == "Booked."
    assert [(t.name, t.arguments, t.result, t.call_id) for t in run.tools] == [
        ("book", {"city": "Rome"}, {"booked": True}, "b1")]
    assert run.tool_definitions == [{"type": "function", "name": "book", "description": "Book a trip",
                                     "parameters": {"type": "object"}}]
    assert (run.usage.input_tokens, run.usage.output_tokens) == (9, 3)
    out = __import__("io").StringIO()
    result = export_dataset(store.reader(), out)
    assert result.written == 1
    example = json.loads(out.getvalue())
    assert [m["role"] for m in example["messages"]] == ["user", "tool", "assistant"]
    assert example["tools"][0]["function"]["name"] == "book"


def test_legacy_per_message_log_events_and_error_status():
    tracer, exporter = _spans()
    log_exporter = InMemoryLogRecordExporter()
    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    logger = lp.get_logger("openai-v2")
    with tracer.start_as_current_span("chat gpt-4o", attributes={
        "gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o",
    }) as span:
        ctx = trace.set_span_in_context(span)
        logger.emit(event_name="gen_ai.system.message", body={"content": "Sys."}, context=ctx)
        logger.emit(event_name="gen_ai.user.message", body={"content": "Hi there"}, context=ctx)
        logger.emit(event_name="gen_ai.choice", context=ctx, body={
            "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hello!"}})
        span.set_status(Status(StatusCode.ERROR, "rate limited"))
    run = reconstruct(_store(exporter, log_exporter).reader(), _tid(span))
    assert [(m.role, m.content()) for m in run.input] == [("system", "Sys."), ("user", "Hi there")]
    assert run.output == "Hello!"
    assert run.status == "error" and run.status_message == "rate limited"


def test_foreign_child_trace_linked_into_a_tree():
    """An agenttape coordinator whose child runs elsewhere under another instrumentation, found by span link."""
    tracer, exporter = _spans()
    with tracer.start_as_current_span("invoke_agent boss", attributes={
        "gen_ai.operation.name": "invoke_agent", "agenttape.run.id": "boss", "agenttape.node.type": "run",
        "gen_ai.agent.name": "boss",
    }) as boss:
        pass
    link = trace.Link(boss.get_span_context())
    with tracer.start_as_current_span("invoke_agent helper", context=trace.set_span_in_context(trace.INVALID_SPAN),
                                      links=[link], attributes={
                                          "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper",
                                          "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                                              {"type": "text", "content": "helped"}]}])}) as helper:
        pass
    assert _tid(helper) != _tid(boss)
    store = _store(exporter)
    tree = reconstruct_tree(store.reader(), "boss")
    # another instrumentation's run span is the run named by its span id, in its trace
    helper_id = format(helper.get_span_context().span_id, "016x")
    assert [(c.ref, c.agent, c.output) for c in tree.children] == [(f"{helper_id}@{_tid(helper)}", "helper", "helped")]
    listed = {r.ref: r for r in Tapes(store.reader()).runs().runs}
    assert listed[f"{helper_id}@{_tid(helper)}"].parent_ref.startswith("boss@")
