"""Agents and servers shared by the tape tests: a small tool-using agent written against the capture
API, a scripted model and tools it can run live, and a receiver on 127.0.0.1 to record into."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import otel_agenttape
from otel_agenttape.receiver.server import TapeServer
from otel_agenttape.tape.replay import ModelResult
from otel_agenttape.tape.model import Usage

SYSTEM = "You are a terse travel assistant."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
MODEL = "fake-1"


class ScriptedModel:
    """A deterministic "live" model: asks for the weather once, then answers from the tool result."""

    def __init__(self, answer_prefix: str = "In") -> None:
        self.answer_prefix = answer_prefix
        self.calls = 0

    def _respond(self, request: dict[str, Any]) -> ModelResult:
        self.calls += 1
        messages = request["messages"]
        last = messages[-1]
        if last["role"] == "user":
            city = last["content"].rsplit(" ", 1)[-1].strip("?")
            call = {"id": f"call_{self.calls}", "name": "get_weather", "arguments": {"city": city}}
            raw = {
                "id": f"resp_{self.calls}",
                "model": MODEL,
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "Checking.",
                    "tool_calls": [{"id": call["id"], "type": "function", "function": {
                        "name": "get_weather", "arguments": json.dumps(call["arguments"])}}]}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3},
            }
            return ModelResult(text="Checking.", raw=raw, tool_calls=[call], finish_reason="tool_calls",
                               model=MODEL, usage=Usage(12, 3), deltas=["Check", "ing."])
        weather = json.loads(last["content"])
        text = f"{self.answer_prefix} {weather['city']} it is {weather['temp']}F."
        raw = {"id": f"resp_{self.calls}", "model": MODEL,
               "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
               "usage": {"prompt_tokens": 30, "completion_tokens": 8}}
        words = text.split(" ")
        deltas = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
        return ModelResult(text=text, raw=raw, finish_reason="stop", model=MODEL, usage=Usage(30, 8), deltas=deltas)

    def create(self, request: dict[str, Any]) -> ModelResult:
        return self._respond(request)

    def stream(self, request: dict[str, Any]) -> _Stream:
        return _Stream(self._respond(request))


class _Stream:
    def __init__(self, result: ModelResult) -> None:
        self._result = result
        self.result: ModelResult | None = None

    def __iter__(self) -> Iterator[str]:
        yield from self._result.deltas
        self.result = self._result


class ScriptedTools:
    """Tools with fixed answers (and a call log, to see that a replay did not run them)."""

    TEMPS = {"Paris": 57, "Oslo": 31, "Lima": 66, "Rome": 70}

    def __init__(self, fail: bool = False) -> None:
        self.log: list[tuple[str, Any]] = []
        self.fail = fail

    def execute(self, name: str, arguments: Any = None, *, call_id: str | None = None) -> Any:
        self.log.append((name, arguments))
        if self.fail:
            raise RuntimeError("weather service down")
        city = arguments["city"]
        return {"city": city, "temp": self.TEMPS.get(city, 60)}


def weather_agent(tape: Any, model: Any, tools: Any, question: str, *, parent: Any = None,
                  agent: str = "weather", run_id: str | None = None, session_id: str | None = None) -> str:
    """A tool-using agent loop recorded through the capture API; ``model``/``tools`` are swappable."""
    kwargs: dict[str, Any] = {"input": question, "run_id": run_id, "session_id": session_id}
    if parent is not None:
        kwargs["parent"] = parent
    with tape.run(agent, **kwargs) as run:
        messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
        for _ in range(4):
            request = {"model": MODEL, "system": SYSTEM, "messages": list(messages), "tools": TOOLS}
            with run.model_call(model=MODEL, messages=list(messages), system=SYSTEM, tools=TOOLS,
                                provider="fake") as call:
                stream = model.stream(request)
                for delta in stream:
                    call.delta(delta)
                result = stream.result
                call.finish(raw=result.raw, tool_calls=[
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                    for c in result.tool_calls] or None)
            if not result.tool_calls:
                run.set_output(result.text)
                return result.text
            messages.append({"role": "assistant", "content": result.text, "tool_calls": [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for c in result.tool_calls]})
            for c in result.tool_calls:
                with run.tool_call(c["name"], c["arguments"], call_id=c["id"]) as tool:
                    value = tools.execute(c["name"], c["arguments"], call_id=c["id"])
                    tool.result(value)
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(value)})
        raise RuntimeError("no answer after 4 model calls")


def start_server(db: str | None, parquet_dir: str | None = None) -> TapeServer:
    server = TapeServer(db, host="127.0.0.1", http_port=0, grpc_port=0, parquet_dir=parquet_dir,
                        grpc_enabled=False)
    server.start()
    return server


def recorder(server: TapeServer, **kwargs: Any) -> Any:
    """A capture Tape exporting OTLP/HTTP to ``server``."""
    return otel_agenttape.setup(endpoint=server.url, protocol="http/protobuf", service_name="tape-tests",
                                seal=False, **kwargs)


def flush(tape: Any, server: TapeServer) -> None:
    tape.force_flush()
    assert server.wait_idle(30), "receiver did not drain"
