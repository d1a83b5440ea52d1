"""A LangGraph program driven offline by langchain_core's fake chat models, for the integration tests.

``ToolCallingFake`` is ``FakeMessagesListChatModel`` that accepts ``bind_tools``; ``AnsweringFake``
answers from the conversation (asks for a tool, then answers from its result), so a second process
gets the same answers. ``trip_graph()`` is a graph whose ``weather`` node is a ReAct subgraph.

Run as a script it is the resume scenario: ``python integrations_langgraph_app.py RECEIVER JOURNAL
WORKDIR [crash]``; with ``crash`` the process dies in the second model call, after ``charge`` committed.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent


class ToolCallingFake(FakeMessagesListChatModel):
    """The scripted fake chat model, usable where a graph binds tools to its model."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


class AnsweringFake(BaseChatModel):
    """Asks for ``charge`` on a fresh question and answers from its result; counts calls in a file."""

    log: str
    crash_at: int = 0

    @property
    def _llm_type(self) -> str:
        return "answering-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        log = Path(self.log)
        with log.open("a") as f:
            f.write("call\n")
        if self.crash_at and len(log.read_text().split()) == self.crash_at:
            os._exit(17)
        last = messages[-1]
        if isinstance(last, ToolMessage):
            receipt = json.loads(last.content)["receipt"]
            message = AIMessage(content=f"Paid 42, receipt {receipt}.")
        else:
            message = AIMessage(content="", tool_calls=[{"id": "call_c", "name": "charge", "args": {"amount": 42}}])
        message.usage_metadata = {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}
        return ChatResult(generations=[ChatGeneration(message=message)])


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return json.dumps({"city": city, "temp": 57})


def trip_graph() -> Any:
    model = ToolCallingFake(responses=[
        AIMessage(content="", tool_calls=[{"id": "call_w", "name": "get_weather", "args": {"city": "Lyon"}}]),
        AIMessage(content="Lyon: 57F and sunny."),
    ])
    weather = create_react_agent(model, [get_weather], name="weather_agent")

    def summarize(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="Summary: " + state["messages"][-1].content)]}

    graph = StateGraph(MessagesState)
    graph.add_node("weather", weather)
    graph.add_node("summarize", summarize)
    graph.add_edge(START, "weather")
    graph.add_edge("weather", "summarize")
    graph.add_edge("summarize", END)
    return graph.compile(name="trip_graph")


def question() -> dict[str, Any]:
    return {"messages": [HumanMessage(content="Weather in Lyon?")]}


def resume_main(receiver: str, journal: str, workdir: str, crash: bool) -> int:
    import otel_agenttape
    from otel_agenttape.integrations.langchain import AgentTapeCallbackHandler
    from otel_agenttape.integrations.langchain_resume import resumable_chat_model, resumable_tool
    from otel_agenttape.resume import ResumeIndex

    work = Path(workdir)
    charges = work / "charges.txt"

    @tool
    def charge(amount: int) -> str:
        """Charge the card (a side effect)."""
        with charges.open("a") as f:
            f.write(f"{amount}\n")
        return json.dumps({"charged": amount, "receipt": f"R-{len(charges.read_text().split())}"})

    index = ResumeIndex("order-9", journal=journal)
    tape = otel_agenttape.setup(receiver, service_name="payments-graph")
    model = resumable_chat_model(AnsweringFake(log=str(work / "model_calls.txt"), crash_at=2 if crash else 0), index)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(model, [resumable_tool(charge, index)], name="cashier")
    handler = AgentTapeCallbackHandler(tape)
    run_id = f"lg-pay-{'crash' if crash else 'ok'}"
    out = agent.invoke({"messages": [HumanMessage(content="Charge 42")]},
                       config={"callbacks": [handler], "metadata": {"session_id": "sess-lg", "agenttape.run.id": run_id}})
    tape.shutdown()
    print(json.dumps({"output": out["messages"][-1].content, "model_hits": index.counters["model"]["hits"],
                      "tool_hits": index.counters["tool"]["hits"]}))
    index.close()
    return 0


if __name__ == "__main__":
    sys.exit(resume_main(sys.argv[1], sys.argv[2], sys.argv[3], len(sys.argv) > 4 and sys.argv[4] == "crash"))
