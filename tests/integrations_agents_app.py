"""An OpenAI Agents SDK program driven offline by a fake ``Model``, for the integration tests.

``FakeChatModel`` answers from a script and records its call like the SDK's chat-completions model
does (a generation span with the prompt, the output and usage). ``trip_agents()`` builds a planner
with a function tool, an agent used as a tool, a guardrail and a handoff to a booker.

Run as a script it is the resume scenario: ``python integrations_agents_app.py RECEIVER JOURNAL
WORKDIR [crash]`` records a run whose model calls and ``charge`` side effects are counted in files
under WORKDIR; with ``crash`` the process dies in the second model call, after ``charge`` committed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # the SDK's uploader never runs

from agents import (  # noqa: E402
    Agent,
    GuardrailFunctionOutput,
    Runner,
    function_tool,
    input_guardrail,
    set_trace_processors,
    set_tracing_disabled,
    trace,
)
from agents.items import ModelResponse  # noqa: E402
from agents.models.chatcmpl_converter import Converter  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.testing import assistant_message, function_call  # noqa: E402
from agents.tracing import generation_span  # noqa: E402
from agents.usage import Usage  # noqa: E402


class FakeChatModel(Model):
    """Answers each call with the next scripted output; ``on_call(n)`` runs before answer n."""

    def __init__(self, name: str, script: Any, on_call: Any = None) -> None:
        self.name = name
        self.script = script if callable(script) else list(script)
        self.calls: list[Any] = []
        self.on_call = on_call

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, **kwargs) -> ModelResponse:
        self.calls.append(input)
        if self.on_call is not None:
            self.on_call(len(self.calls))
        messages = Converter.items_to_messages(input)
        with generation_span(model=self.name, model_config={"temperature": 0.0}) as span:
            output = self.script(input) if callable(self.script) else self.script.pop(0)
            if system_instructions:
                messages = [{"role": "system", "content": system_instructions}, *messages]
            span.span_data.input = messages
            span.span_data.output = Converter.items_to_messages([o.model_dump() for o in output])
            span.span_data.usage = {"input_tokens": 11, "output_tokens": 4}
            return ModelResponse(output=output, usage=Usage(requests=1, input_tokens=11, output_tokens=4,
                                                            total_tokens=15), response_id=f"resp-{len(self.calls)}")

    def stream_response(self, *args: Any, **kwargs: Any):  # pragma: no cover - not used
        raise NotImplementedError


@function_tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return json.dumps({"city": city, "temp": 57})


@input_guardrail
async def polite(ctx, agent, user_input) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info={"polite": True}, tripwire_triggered=False)


def trip_agents() -> tuple[Agent, dict[str, FakeChatModel]]:
    models = {
        "booker": FakeChatModel("fake-booker", [[assistant_message("Booked Le Bouchon at 12:30.")]]),
        "researcher": FakeChatModel("fake-research", [[assistant_message("Vieux Lyon is lovely.")]]),
        "planner": FakeChatModel("fake-planner", [
            [function_call("get_weather", {"city": "Lyon"}, call_id="call_w"),
             function_call("research", {"input": "old town of Lyon"}, call_id="call_r")],
            [function_call("transfer_to_booker", {}, call_id="call_h")],
        ]),
    }
    booker = Agent(name="booker", instructions="You book tables.", model=models["booker"])
    researcher = Agent(name="researcher", instructions="You research places.", model=models["researcher"])
    planner = Agent(
        name="planner", instructions="You plan trips.", model=models["planner"],
        tools=[get_weather, researcher.as_tool(tool_name="research", tool_description="Research a place")],
        handoffs=[booker], input_guardrails=[polite],
    )
    return planner, models


def _count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def resume_main(receiver: str, journal: str, workdir: str, crash: bool) -> int:
    import asyncio

    import otel_agenttape
    from otel_agenttape.integrations.openai_agents import AgentTapeProcessor
    from otel_agenttape.integrations.openai_agents_resume import ResumableModel, resumable_tools
    from otel_agenttape.resume import ResumeIndex

    work = Path(workdir)
    model_log, charges = work / "model_calls.txt", work / "charges.txt"

    def on_call(_: int) -> None:
        with model_log.open("a") as f:
            f.write("call\n")
        if crash and _count(model_log) == 2:
            os._exit(17)  # dies in the second model call: the charge before it was committed

    @function_tool
    def charge(amount: int) -> str:
        """Charge the card (a side effect)."""
        with charges.open("a") as f:
            f.write(f"{amount}\n")
        return json.dumps({"charged": amount, "receipt": f"R-{_count(charges)}"})

    def answer(items: Any) -> list[Any]:  # asks for the charge, then answers from its output
        done = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if done:
            return [assistant_message(f"Paid 42, receipt {json.loads(done[-1]['output'])['receipt']}.")]
        return [function_call("charge", {"amount": 42}, call_id="call_c")]

    inner = FakeChatModel("fake-pay", answer, on_call=on_call)
    index = ResumeIndex("order-7", journal=journal)
    tape = otel_agenttape.setup(receiver, service_name="payments")
    set_tracing_disabled(False)
    set_trace_processors([AgentTapeProcessor(tape)])
    agent = Agent(name="cashier", instructions="You take payments.", model=ResumableModel(inner, index),
                  tools=resumable_tools([charge], index))

    async def go() -> str:
        with trace("payment", group_id="sess-pay", metadata={"agenttape.run.id": f"pay-{'crash' if crash else 'ok'}"}):
            result = await Runner.run(agent, "Charge 42")
        return result.final_output

    out = asyncio.run(go())
    tape.shutdown()
    print(json.dumps({"output": out, "model_hits": index.counters["model"]["hits"],
                      "tool_hits": index.counters["tool"]["hits"]}))
    index.close()
    return 0


if __name__ == "__main__":
    sys.exit(resume_main(sys.argv[1], sys.argv[2], sys.argv[3], len(sys.argv) > 4 and sys.argv[4] == "crash"))
