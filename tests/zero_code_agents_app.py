"""An OpenAI Agents SDK app for the zero-code tests: run under ``opentelemetry-instrument``, it adds
otel-agenttape's Agents SDK processor to the Tape the distro configured (one line), and its agent
calls the model through the OpenAI SDK (``OpenAIChatCompletionsModel``), which the OpenAI SDK
instrumentation records too.

    python zero_code_agents_app.py OPENAI_BASE_URL QUESTION [DIRECT_QUESTION] [--sdk-only]

The agent asks for ``get_weather``, runs it and answers; prints the answer. With ``DIRECT_QUESTION``
the app then asks it once through the OpenAI SDK itself, outside the Agents SDK. ``--sdk-only``
leaves our processor out (the Agents SDK instrumentation the distro enabled records the run).
"""

from __future__ import annotations

import asyncio
import json
import sys

import openai
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool

import otel_agenttape


@function_tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return json.dumps({"city": city, "temp": 57})


def main(base_url: str, question: str, direct: str | None, sdk_only: bool) -> None:
    if not sdk_only:
        from otel_agenttape.integrations.openai_agents import instrument_openai_agents

        instrument_openai_agents(otel_agenttape.register())  # register(): the distro's Tape
    client = openai.AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0)
    agent = Agent(name="forecaster", instructions="You know the weather.", tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model="gpt-test", openai_client=client))
    print(asyncio.run(Runner.run(agent, question)).final_output, flush=True)
    if direct:
        sync = openai.OpenAI(base_url=base_url, api_key="test", max_retries=0)
        answer = sync.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": direct}])
        print(answer.choices[0].message.tool_calls[0].function.arguments, flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--sdk-only"]
    main(args[0], args[1], args[2] if len(args) > 2 else None, "--sdk-only" in sys.argv)
