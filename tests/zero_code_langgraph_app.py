"""A LangGraph app with no telemetry code, for the zero-code tests (run under ``opentelemetry-instrument``).

    python zero_code_langgraph_app.py OPENAI_BASE_URL QUESTION

A ``StateGraph`` whose triage node (a ``ChatOpenAI`` offered a transfer tool) hands over to a ReAct
weather specialist, invoked as LangGraph's docs show; prints the final answer.
"""

from __future__ import annotations

import json
import sys
import warnings

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return json.dumps({"city": city, "temp": 57})


@tool
def transfer_to_specialist() -> str:
    """Hand the question to the weather specialist."""
    return "transferred"


def handoff_graph(base_url: str):  # noqa: ANN201 - a compiled LangGraph graph
    """The two-agent graph, compiled (the foreign-convention tests trace the same graph by hand)."""
    model = ChatOpenAI(model="gpt-test", base_url=base_url, api_key="test", max_retries=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        specialist = create_react_agent(model, [get_weather], name="specialist", prompt="You know the weather.")

    def triage(state: MessagesState) -> Command:
        answer = model.bind_tools([transfer_to_specialist]).invoke(state["messages"])
        wanted = {c["name"] for c in answer.tool_calls}
        return Command(goto="specialist" if "transfer_to_specialist" in wanted else "__end__")

    graph = StateGraph(MessagesState)
    graph.add_node("triage", triage, destinations=("specialist",))
    graph.add_node("specialist", specialist)
    graph.add_edge(START, "triage")
    return graph.compile()


def main(base_url: str, question: str) -> None:
    out = handoff_graph(base_url).invoke({"messages": [HumanMessage(question)]})
    print(out["messages"][-1].content, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
