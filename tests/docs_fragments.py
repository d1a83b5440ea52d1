"""What the docs' code fragments take from the reader's own program, for tests/test_docs_examples.py.

A fragment such as ``graph.invoke(...)`` or ``await call_tool(run, session, ...)`` names objects the
reader's program defines; a block's ``<!-- docs-test: setup: ... -->`` builds them from here. Nothing
here reaches a network: the model APIs are answered in-process, the MCP server runs over stdio.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_KEEP: list[Any] = []


def _chat_completion(request: Any) -> Any:
    import httpx

    return httpx.Response(200, json={
        "id": "chatcmpl-docs", "object": "chat.completion", "created": 0, "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Morning in Vieux Lyon, lunch at a bouchon."}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}})


def offline_openai_agents() -> None:
    """The Agents SDK's default model client answers in-process (chat completions, one scripted reply)."""
    import httpx
    from agents import set_default_openai_api, set_default_openai_client
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="sk-docs-test-offline",
                         http_client=httpx.AsyncClient(transport=httpx.MockTransport(_chat_completion)))
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("chat_completions")


def agents_tools() -> tuple[Any, Any]:
    """``charge`` and ``lookup`` as the Agents SDK's function tools."""
    from agents import function_tool

    @function_tool
    def charge(amount: int) -> str:
        """Charge the customer."""
        return json.dumps({"charged": amount})

    @function_tool
    def lookup(city: str) -> str:
        """Current weather for a city."""
        return json.dumps({"city": city, "temp_c": 14})

    return charge, lookup


async def mcp_session(receiver: str) -> Any:
    """A ``ClientSession`` to tests/integrations_mcp_server.py over stdio (its spans go to ``receiver``);
    it stays open until the process ends."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    stack = contextlib.AsyncExitStack()
    params = StdioServerParameters(command=sys.executable, args=[str(HERE / "integrations_mcp_server.py")],
                                   env={**os.environ, "AGENTTAPE_TEST_RECEIVER": receiver})
    read, write = await stack.enter_async_context(stdio_client(params))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    _KEEP.append(stack)
    return session


def open_run(tape: Any, **kwargs: Any) -> Any:
    """A run of ``tape`` left open, as inside the reader's ``with tape.run(...) as run:``."""
    manager = tape.run(**kwargs)
    _KEEP.append(manager)
    return manager.__enter__()


def openinference_trace() -> dict[str, Any]:
    """One OpenInference agent run, the README's ``e3a1f0c2d4b5a697@4bf92f3577b34da6a3ce929d0e0e4736``."""
    def attr(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    return {"resourceSpans": [{
        "resource": {"attributes": [attr("service.name", "support-bot")]},
        "scopeSpans": [{"scope": {"name": "openinference.instrumentation.openai"}, "spans": [{
            "traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "e3a1f0c2d4b5a697",
            "name": "support", "kind": 1,
            "startTimeUnixNano": "1764495000000000000", "endTimeUnixNano": "1764495002000000000",
            "attributes": [attr("openinference.span.kind", "AGENT"), attr("agent.name", "support"),
                           attr("session.id", "sess-42"), attr("input.value", "Where is my order?"),
                           attr("output.value", "It shipped yesterday.")]}]}]}]}


def demo_ref(agent: str, db: str = "agenttape.duckdb") -> str:
    """The ref of the demo's run of ``agent`` (the demo's run ids are new on every recording)."""
    import otel_agenttape

    with otel_agenttape.open(db) as tapes:
        return tapes.runs(agent=agent).runs[0].ref


def langchain_stand_ins() -> tuple[Any, Any]:
    """``ChatOpenAI`` (a scripted fake chat model: langchain-openai is not a test dependency) and a
    ``charge`` tool, for a LangGraph fragment."""
    from integrations_langgraph_app import ToolCallingFake
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    def chat_openai(model: str) -> Any:
        return ToolCallingFake(responses=[AIMessage(content="Charged.")])

    @tool
    def charge(amount: int) -> str:
        """Charge the customer."""
        return json.dumps({"charged": amount})

    return chat_openai, charge
