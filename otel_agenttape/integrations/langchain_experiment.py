"""LangChain and LangGraph in a program-level experiment: the program's tools answered from the tape.

    def program(ctx):                       # otel_agenttape.experiment(name, runs, program, ...)
        model = ChatOpenAI(model=ctx.model, base_url=CANDIDATE_URL)
        agent = create_react_agent(model, served_tools([get_weather, charge], ctx.tools))
        out = agent.invoke({"messages": ctx.messages}, config={"callbacks": [AgentTapeCallbackHandler(ctx.tape)]})
        return out["messages"][-1].content

Each tool keeps its name, description and schema; a call goes to ``executor.execute(name, arguments)``
(the experiment's ``TapeTools``: the recorded result when the call matches one, else its policy). Under
``tools="live"`` the real tool is what runs for a call the tape does not hold.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

try:
    from langchain_core.tools import BaseTool, StructuredTool
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError('LangChain is needed: pip install "otel-agenttape[langgraph]"') from exc


def _content(value: Any) -> Any:
    """A recorded result as a tool message's content (a JSON value read back from the tape as text)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def served_tools(tools: Sequence[BaseTool], executor: Any) -> list[StructuredTool]:
    """``tools`` with their calls answered by ``executor`` (an object with ``execute(name, arguments)``
    and, for the live policy, a ``live`` mapping the real tools are added to)."""
    live = getattr(executor, "live", None)

    def serve(name: str) -> Any:
        def func(**arguments: Any) -> Any:
            return _content(executor.execute(name, arguments))

        return func

    def real(tool: BaseTool) -> Any:
        return lambda **arguments: tool.invoke(arguments, config={"callbacks": []})

    out = []
    for tool in tools:
        if isinstance(live, dict) and tool.name not in live:
            live[tool.name] = real(tool)
        out.append(StructuredTool.from_function(func=serve(tool.name), name=tool.name, description=tool.description,
                                                args_schema=tool.args_schema))
    return out
