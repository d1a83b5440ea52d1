"""A framework program under the framework's own OpenTelemetry instrumentation, exporting OTLP.

Usage: python integrations_foreign_app.py INSTRUMENTATION RECEIVER_URL OPENAI_BASE_URL
INSTRUMENTATION: ``oi-agents`` (openinference-instrumentation-openai-agents), ``otel-agents``
(opentelemetry-instrumentation-openai-agents-v2), ``oi-langchain`` (openinference-instrumentation-
langchain), ``otel-langchain`` (opentelemetry-instrumentation-langchain); ``oi-agents-trip`` and
``otel-agents-trip`` run the trip planner of ``integrations_agents_app`` on its fake models instead;
``oi-agents-handoff`` and ``oi-langgraph-handoff`` are two agents (a triage agent handing over to a weather
specialist) on the fake OpenAI server, the Agents SDK's chat-completions model or LangChain's ``ChatOpenAI``
in a LangGraph ``StateGraph``, asked the question given as a fourth argument. The Agents SDK programs use
its chat-completions model against the fake OpenAI server; the LangGraph ones a ReAct agent on the
same server through ``langchain_core``'s fake chat model. Prints the trace id of the program's trace.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import warnings

os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # until the program replaces the SDK's uploader
os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"
os.environ["TRACELOOP_TRACE_CONTENT"] = "true"


def provider(receiver: str, name: str):
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    tp = TracerProvider(resource=Resource.create({"service.name": name}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver}/v1/traces")))
    _remember_traces(tp)
    trace.set_tracer_provider(tp)
    return tp


def instrument_agents(kind: str, tp) -> None:
    """The Agents SDK under one instrumentation: ``oi-agents*`` OpenInference's, else the OTel one."""
    from agents import set_trace_processors, set_tracing_disabled

    set_trace_processors([])  # the SDK's own uploader never runs; the instrumentation adds its processor
    set_tracing_disabled(False)
    if kind.startswith("oi-agents"):
        from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    else:
        from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    OpenAIAgentsInstrumentor().instrument(tracer_provider=tp)


def agents_program(kind: str, receiver: str, base_url: str) -> str:
    tp = provider(receiver, f"weather-{kind}")
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, trace
    from openai import AsyncOpenAI

    instrument_agents(kind, tp)

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return json.dumps({"city": city, "temp": 57})

    client = AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0)
    agent = Agent(name="weather", instructions="You are terse.", tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model="gpt-test", openai_client=client))

    async def go() -> str:
        with trace("weather", group_id="sess-foreign"):
            return (await Runner.run(agent, "Weather in Paris?")).final_output

    print(asyncio.run(go()), file=sys.stderr)
    tp.force_flush()
    return _TRACE_IDS[-1] if _TRACE_IDS else ""


def agents_trip_program(kind: str, receiver: str) -> str:
    """The planner of ``integrations_agents_app.trip_agents`` (a function tool, an agent used as a tool,
    a guardrail and a handoff) on its fake models, under the instrumentation instead of our processor."""
    tp = provider(receiver, f"trip-{kind}")
    from agents import Runner, trace

    instrument_agents(kind, tp)
    from integrations_agents_app import trip_agents

    planner, _ = trip_agents()

    async def go() -> str:
        with trace("trip", group_id="sess-trip"):
            return (await Runner.run(planner, "Plan lunch in Lyon")).final_output

    print(asyncio.run(go()), file=sys.stderr)
    tp.force_flush()
    return _TRACE_IDS[-1] if _TRACE_IDS else ""


_TRACE_IDS: list[str] = []  # trace ids of the root spans the program ended


def _remember_traces(tp) -> None:
    from opentelemetry.sdk.trace import SpanProcessor

    class Remember(SpanProcessor):
        def on_end(self, span) -> None:
            if span.parent is None:
                _TRACE_IDS.append(format(span.context.trace_id, "032x"))

    tp.add_span_processor(Remember())


def langchain_program(kind: str, receiver: str, base_url: str) -> str:
    tp = provider(receiver, f"weather-{kind}")
    if kind == "oi-langchain":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        LangChainInstrumentor().instrument(tracer_provider=tp)
    else:
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor

        LangchainInstrumentor().instrument(tracer_provider=tp)
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool

    from integrations_langgraph_app import ToolCallingFake

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return json.dumps({"city": city, "temp": 57})

    model = ToolCallingFake(responses=[
        AIMessage(content="", tool_calls=[{"id": "call_1", "name": "get_weather", "args": {"city": "Paris"}}]),
        AIMessage(content="It is 57F in Paris."),
    ])
    agent = create_react_agent(model, [get_weather], name="weather", prompt="You are terse.")
    out = agent.invoke({"messages": [HumanMessage(content="Weather in Paris?")]},
                       config={"metadata": {"session_id": "sess-foreign"}})
    print(out["messages"][-1].content, file=sys.stderr)
    tp.force_flush()
    return _TRACE_IDS[-1] if _TRACE_IDS else ""


def agents_handoff_program(kind: str, receiver: str, base_url: str, question: str) -> str:
    """A triage agent that hands over to a weather specialist, both on the fake OpenAI server."""
    tp = provider(receiver, f"handoff-{kind}")
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
    from openai import AsyncOpenAI

    instrument_agents(kind, tp)

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return json.dumps({"city": city, "temp": 57})

    client = AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0)
    model = OpenAIChatCompletionsModel(model="gpt-test", openai_client=client)
    specialist = Agent(name="specialist", instructions="You know the weather.", tools=[get_weather], model=model)
    triage = Agent(name="triage", instructions="You route questions.", handoffs=[specialist], model=model)
    print(asyncio.run(Runner.run(triage, question)).final_output, file=sys.stderr)
    tp.force_flush()
    return _TRACE_IDS[-1] if _TRACE_IDS else ""


def langgraph_handoff_program(kind: str, receiver: str, base_url: str, question: str) -> str:
    """A ``StateGraph`` whose triage node (a ``ChatOpenAI`` offered a transfer tool) hands over to a ReAct
    weather specialist, invoked with the question as a ``HumanMessage``."""
    tp = provider(receiver, f"handoff-{kind}")
    from openinference.instrumentation.langchain import LangChainInstrumentor

    LangChainInstrumentor().instrument(tracer_provider=tp)
    from langchain_core.messages import HumanMessage
    from zero_code_langgraph_app import handoff_graph

    app = handoff_graph(base_url)
    out = app.invoke({"messages": [HumanMessage(question)]})
    print(out["messages"][-1].content, file=sys.stderr)
    tp.force_flush()
    return _TRACE_IDS[-1] if _TRACE_IDS else ""


def main() -> int:
    kind, receiver, base_url = sys.argv[1:4]
    if kind.endswith("-trip"):
        print(agents_trip_program(kind, receiver))
        return 0
    if kind.endswith("-handoff"):
        program = agents_handoff_program if kind == "oi-agents-handoff" else langgraph_handoff_program
        print(program(kind, receiver, base_url, sys.argv[4]))
        return 0
    program = agents_program if kind in ("oi-agents", "otel-agents") else langchain_program
    print(program(kind, receiver, base_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
