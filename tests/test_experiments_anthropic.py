"""An Anthropic candidate: recorded OpenAI-style prompts sent through the Anthropic SDK to a fake Messages
API on 127.0.0.1 (system apart, tool calls and results as blocks), the answers read back for compare."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from experiment_fakes import ChatServer, claude_message
from tape_agents import SYSTEM, ScriptedModel, ScriptedTools, flush, recorder, start_server, weather_agent

import otel_agenttape
from otel_agenttape import cli
from otel_agenttape.tape.experiment_anthropic import AnthropicChat, from_anthropic, to_anthropic

pytest.importorskip("anthropic")


def claude(body, n):
    """Asks for the weather (with a word first), then answers in its own words from the tool result."""
    last = body["messages"][-1]
    results = [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    if results:
        d = json.loads(results[0]["content"])
        return 200, claude_message(body, n, [{"type": "text", "text": f"{d['city']}: {d['temp']}F"}],
                                   input_tokens=40, output_tokens=9)
    city = last["content"][-1]["text"].rsplit(" ", 1)[-1].strip("?")
    return 200, claude_message(body, n, [{"type": "text", "text": "Checking."},
                                         {"type": "tool_use", "id": f"toolu_{n}", "name": "get_weather",
                                          "input": {"city": city}}], stop="tool_use", input_tokens=30, output_tokens=5)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("anthropic")
    db = str(root / "tape.duckdb")
    server = start_server(db)
    tape = recorder(server)
    try:
        weather_agent(tape, ScriptedModel(), ScriptedTools(), "Weather in Paris?", run_id="paris")
        flush(tape, server)
    finally:
        tape.shutdown()
    with ChatServer(claude) as fake:
        yield {"db": db, "server": server, "root": root, "fake": fake}
    server.stop()


def _cli(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(list(args))
    return code, out.getvalue()


def test_cli_sends_claude_the_converted_prompt_and_compare_reads_its_answers(env, monkeypatch):
    monkeypatch.setenv("CLAUDE_KEY", "sk-ant-test")
    code, text = _cli("experiment", "run", "claude", "--provider", "anthropic", "--model", "claude-haiku-4-5",
                      "--base-url", env["fake"].root_url, "--api-key-env", "CLAUDE_KEY", "--run", "paris",
                      "--endpoint", env["server"].url, "--journal", str(env["root"] / "claude.sqlite"),
                      "--no-seal", "--db", env["db"], "--json")
    assert code == 0, text
    assert json.loads(text)["answered"] == 2
    assert env["server"].wait_idle(30)
    fake = env["fake"]
    assert [(path, "sk-ant-test" in (key or "")) for path, key in fake.paths] == [("/v1/messages", True)] * 2
    first, second = sorted(fake.requests, key=lambda r: len(r["messages"]))
    tools = [{"name": "get_weather", "description": "Current weather for a city", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    assert first == {"model": "claude-haiku-4-5", "max_tokens": 1024, "system": SYSTEM, "tools": tools,
                     "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}]}
    assert second["system"] == SYSTEM and second["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {
            "type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                      "content": '{"city":"Paris","temp":57}'}]}]

    with otel_agenttape.open(env["db"]) as tapes:
        cmp = tapes.compare("claude", prompts=True)
        (run,) = {r.agent for r in tapes.experiment_runs("claude")}
    s = cmp.summary()
    # node 1: same words and the same tool call (tool_use read back); node 2: Claude's own words
    assert (s["runs"], s["errors"], s["answer_same"], s["tool_agreement"]) == (2, 0, 0.5, 1.0)
    assert (s["candidate_input_tokens"], s["candidate_output_tokens"]) == (70, 14)
    by_len = sorted(cmp.pairs, key=lambda p: len(p.candidate.prompt))
    assert by_len[0].candidate.model == "claude-haiku-4-5" and by_len[0].candidate.provider == "anthropic"
    assert [m.role for m in by_len[1].candidate.prompt] == ["system", "user", "assistant", "user"]
    assert by_len[1].side(by_len[1].candidate)["answer"] == "Paris: 57F"
    assert run == "weather"

    code, text = _cli("experiment", "run", "claude", "--provider", "anthropic", "--model", "claude-haiku-4-5",
                      "--base-url", env["fake"].root_url, "--api-key-env", "NOT_SET_ANYWHERE", "--run", "paris",
                      "--db", env["db"])
    assert code == 2 and len(fake.requests) == 2  # a missing key is a clear error before anything is sent


def test_conversion_both_ways():
    request = {"model": "m", "temperature": 0.2, "seed": 7, "tool_choice": "required", "stop": "END", "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
        {"role": "user", "content": [{"type": "text", "text": "Two cities?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "wx", "arguments": '{"city": "Oslo"}'}},
            {"id": "b", "type": "function", "function": {"name": "wx", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "a", "content": "cold"},
        {"role": "tool", "tool_call_id": "b", "content": "warm"},
        {"role": "user", "content": "And?"}]}
    out = to_anthropic(request)
    assert out["system"] == "Be terse.\n\nUse tools." and out["max_tokens"] == 1024
    assert out["tool_choice"] == {"type": "any"} and out["stop_sequences"] == ["END"] and "seed" not in out
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]  # results and the next turn merged
    assert out["messages"][0]["content"][1] == {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}
    assert [b["input"] for b in out["messages"][1]["content"]] == [{"city": "Oslo"}, {}]
    assert out["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "a", "content": "cold"},
                                             {"type": "tool_result", "tool_use_id": "b", "content": "warm"},
                                             {"type": "text", "text": "And?"}]
    back = from_anthropic({"id": "msg_1", "model": "claude-x", "stop_reason": "max_tokens", "content": [
        {"type": "text", "text": "Oslo"}, {"type": "tool_use", "id": "t", "name": "wx", "input": {"c": 1}}],
        "usage": {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 4}})
    choice = back["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == "Oslo"
    assert choice["message"]["tool_calls"] == [{"id": "t", "type": "function",
                                                "function": {"name": "wx", "arguments": '{"c": 1}'}}]
    assert back["usage"]["prompt_tokens"] == 7 and back["usage"]["completion_tokens"] == 2


def test_program_client_is_openai_shaped_over_the_anthropic_sdk(env):
    import anthropic

    chat = AnthropicChat(anthropic.Anthropic(base_url=env["fake"].root_url, api_key="k", max_retries=0))
    n = len(env["fake"].requests)
    reply = chat.chat.completions.create(model="claude-x", seed=3, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Rome?"}])
    assert env["fake"].requests[n]["system"] == SYSTEM and "seed" not in env["fake"].requests[n]
    assert reply.choices[0].finish_reason == "tool_calls"
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Rome"})
