"""Content normalization and span classification: the shapes instrumentations write content in."""

from __future__ import annotations

import hashlib

from otel_agenttape.codec.jsontext import parse_any_json, parse_structured_json
from otel_agenttape.codec.messages_flat import choice_messages, event_messages, unflatten
from otel_agenttape.codec.messages_read import system_messages, to_messages, tool_definitions
from otel_agenttape.tape.foreign import classify, truncated_keys
from otel_agenttape.tape.load import SpanRow


def _span(attrs, **kw) -> SpanRow:
    base = dict(trace_id="a" * 32, span_id="b" * 16, parent_span_id=None, name="x", kind=1, start_ns=1, end_ns=2,
                status_code=0, status_message=None, attrs=attrs, run_id=None, parent_run_id=None, node_type=None,
                operation_name=None, agent_name=None, service_name=None)
    base.update(kw)
    return SpanRow(**base)


def test_parse_any_json_parses_only_json_text():
    assert parse_any_json('{"a": 1}') == {"a": 1}
    assert parse_any_json("[1, 2]") == [1, 2]
    assert parse_any_json("rainy, 57F") == "rainy, 57F"
    assert parse_any_json("{not json") == "{not json"
    assert parse_any_json({"a": 1}) == {"a": 1}
    assert parse_any_json("42") == 42 and parse_any_json('"hi"') == "hi" and parse_any_json(b"true") is True


def test_recording_parses_only_objects_and_arrays():
    """Capture keeps a scalar-looking string an agent passed as the string; reading a tape parses it."""
    assert parse_structured_json(' {"a": 1}') == {"a": 1} and parse_structured_json("[1]") == [1]
    assert parse_structured_json("42") == "42" and parse_structured_json('"hi"') == '"hi"'
    assert parse_structured_json(b"[1]") == b"[1]"


def test_messages_in_genai_openai_and_parts_shapes():
    genai = to_messages('[{"role":"user","parts":[{"type":"text","content":"hi"}],"name":null}]')
    openai = to_messages([
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ])
    assert [(m.role, m.content()) for m in genai] == [("user", "hi")]
    assert openai[0].tool_calls == [{"type": "tool_call", "id": "c1", "name": "f", "arguments": {"x": 1}}]
    assert openai[1].tool_responses == [{"type": "tool_call_response", "id": "c1", "response": {"ok": True}}]
    assert openai[2].text == "ab"
    # an array of parts (system instructions) is one message
    system = to_messages([{"type": "text", "content": "A"}, {"type": "text", "content": "B"}], "system")
    assert len(system) == 1 and system[0].text == "AB"
    # round trip to the OpenAI chat shape
    assert openai[0].to_openai() == [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}]}]
    assert openai[1].to_openai() == [{"role": "tool", "tool_call_id": "c1", "content": '{"ok":true}'}]


def test_system_instructions_and_legacy_event_bodies():
    assert system_messages(None) == []
    assert [(m.role, m.text) for m in system_messages('[{"role":"user","content":"Be brief."}]')] == [
        ("system", "Be brief.")]
    tool = event_messages("tool", {"content": "57F", "id": "c1"})
    assert [(m.role, m.tool_responses) for m in tool] == [
        ("tool", [{"type": "tool_call_response", "id": "c1", "response": "57F"}])]
    assert [(m.role, m.text) for m in event_messages("user", "hi")] == [("user", "hi")]
    choice = choice_messages({"message": {"content": "done"}, "finish_reason": "stop"})
    assert [(m.role, m.text, m.finish_reason) for m in choice] == [("assistant", "done", "stop")]


def test_tool_definitions_in_both_shapes():
    flat = tool_definitions('[{"type":"function","name":"f","parameters":{"type":"object"}}]')
    nested = tool_definitions([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert flat == nested == [{"type": "function", "name": "f", "parameters": {"type": "object"}}]


def test_unflatten_indexed_attributes():
    attrs = {"p.0.message.role": "user", "p.1.message.tool_calls.0.tool_call.id": "c", "p.name": "n", "q": 1}
    assert unflatten(attrs, "p.") == {
        "0": {"message": {"role": "user"}}, "1": {"message": {"tool_calls": [{"tool_call": {"id": "c"}}]}},
        "name": "n"}


def test_classify_by_attributes_not_names():
    assert classify(_span({"gen_ai.operation.name": "chat"}, name="anything")) == "model"
    assert classify(_span({"gen_ai.operation.name": "execute_tool"})) == "tool"
    assert classify(_span({"openinference.span.kind": "AGENT"})) == "run"
    assert classify(_span({"openinference.span.kind": "CHAIN"})) == "other"
    assert classify(_span({"traceloop.span.kind": "tool"})) == "tool"
    assert classify(_span({"gen_ai.prompt.0.role": "user"}, name="openai.chat")) == "model"
    assert classify(_span({"gen_ai.prompt.name": "template"})) == "other"  # not a legacy message
    assert classify(_span({}, node_type="run")) == "run"


def test_truncation_detected_from_marker_length_or_hash():
    whole = "x" * 10
    digest = hashlib.sha256(whole.encode()).hexdigest()
    assert truncated_keys(_span({"k": whole, "k.agenttape.length": 10, "k.agenttape.sha256": digest})) == []
    assert truncated_keys(_span({"k": whole[:5], "k.agenttape.length": 10})) == ["k"]
    assert truncated_keys(_span({"k": "y" * 10, "k.agenttape.length": 10, "k.agenttape.sha256": digest})) == ["k"]
    assert truncated_keys(_span({"agenttape.truncated": ["k"], "k": "x"})) == ["k"]
    assert truncated_keys(_span({}, dropped_events=3)) == ["events"]
