"""An MCP server in another process (over stdio): the tool call is a child of the agent's tool node,
and the server's own spans join the caller's trace, through a real ``agenttape serve``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

import otel_agenttape  # noqa: E402
from integrations_support import cli, cli_json, serve  # noqa: E402
from otel_agenttape.integrations.mcp import call_tool  # noqa: E402

HERE = Path(__file__).parent
SERVER = str(HERE / "integrations_mcp_server.py")
ORDER = {"order": "A-17", "status": "shipped", "eta": "2026-12-03"}


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """One receiver and one tape on the global tracer provider (the MCP SDK's spans use the global
    one, and OpenTelemetry lets a process set it once) for this module's tests."""
    from opentelemetry import trace

    with serve(str(tmp_path_factory.mktemp("mcp") / "mcp.duckdb")) as srv:
        tape = otel_agenttape.setup(srv.url, service_name="support", set_global=True)
        if trace.get_tracer_provider() is not tape.tracer_provider:
            pytest.skip("another global tracer provider was set in this process")
        yield srv, tape
        tape.shutdown()


def _server_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTTAPE_")}
    return {**env, "AGENTTAPE_TEST_RECEIVER": url, "OPENAI_AGENTS_DISABLE_TRACING": "1"}


def _spans(capsys, db: str, trace_id: str) -> dict[str, dict]:
    code, out = cli(capsys, "sql", f"SELECT name, service_name, span_id, parent_span_id FROM spans "
                                   f"WHERE trace_id = '{trace_id}' AND name <> 'agenttape.checkpoint'", "--json",
                    "--db", db)
    assert code == 0, out
    return {r["name"]: r for r in json.loads(out)}


def _assert_server_joins(spans: dict[str, dict]) -> None:
    tool = spans["execute_tool lookup_order"]
    client = spans["MCP send tools/call lookup_order"]
    server = spans["tools/call lookup_order"]
    assert client["parent_span_id"] == tool["span_id"] and client["service_name"] == "support"
    assert server["parent_span_id"] == client["span_id"] and server["service_name"] == "orders-mcp"
    assert spans["orders.db.read"]["parent_span_id"] == server["span_id"]  # the tool's own span, server side


def test_mcp_call_from_the_capture_api_joins_the_tree(recording, capsys):
    from mcp import ClientSession, StdioServerParameters, stdio_client

    srv, tape = recording
    params = StdioServerParameters(command=sys.executable, args=[SERVER], env=_server_env(srv.url))

    async def go():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                with tape.run(agent="support", run_id="mcp-1", session_id="sess-m",
                              input="Where is order A-17?") as run:
                    result = await call_tool(run, session, "lookup_order", {"order_id": "A-17"},
                                             call_id="call_o", server="orders")
                    run.set_output("Order A-17 has shipped.")
                return result

    result = asyncio.run(go())
    assert not result.is_error
    assert tape.force_flush()
    srv.wait_stored(6)
    runs = {r["run_id"]: r for r in cli_json(capsys, "runs", "--db", srv.db)}
    assert runs["mcp-1"]["status"] == "completed" and runs["mcp-1"]["session_id"] == "sess-m"
    doc = cli_json(capsys, "replay", "mcp-1", "--tree", "--db", srv.db)
    # one tool call, not two: the server's execute_tool span is the same call
    assert [(t["name"], t["arguments"], t["result"], t["id"]) for t in doc["tools"]] == [
        ("lookup_order", {"order_id": "A-17"}, ORDER, "call_o")]
    assert doc["output"] == "Order A-17 has shipped."
    _assert_server_joins(_spans(capsys, srv.db, doc["trace_id"]))
    code, out = cli(capsys, "verify", "--db", srv.db, "--run", "mcp-1")
    assert code == 0, out


def test_mcp_server_of_an_agents_sdk_agent_joins_the_tree(recording, capsys):
    pytest.importorskip("agents")
    from agents import Agent, Runner, set_trace_processors, set_tracing_disabled, trace
    from agents.mcp import MCPServerStdio
    from agents.testing import assistant_message, function_call

    from integrations_agents_app import FakeChatModel
    from otel_agenttape.integrations.openai_agents import AgentTapeProcessor

    srv, tape = recording
    set_tracing_disabled(False)
    set_trace_processors([AgentTapeProcessor(tape)])
    try:
        model = FakeChatModel("fake-support", [
            [function_call("lookup_order", {"order_id": "A-17"}, call_id="call_o")],
            [assistant_message("Order A-17 has shipped.")]])

        async def go() -> str:
            server = MCPServerStdio({"command": sys.executable, "args": [SERVER], "env": _server_env(srv.url)},
                                    name="orders", client_session_timeout_seconds=120)  # a loaded CI machine
            async with server:
                agent = Agent(name="support", instructions="Answer about orders.", model=model,
                              mcp_servers=[server])
                with trace("support", group_id="sess-ma", metadata={"agenttape.run.id": "mcp-2"}):
                    return (await Runner.run(agent, "Where is order A-17?")).final_output

        assert asyncio.run(go()) == "Order A-17 has shipped."
    finally:
        set_trace_processors([])
        set_tracing_disabled(True)
    assert tape.force_flush()
    srv.wait_stored(6)
    doc = cli_json(capsys, "replay", "mcp-2", "--tree", "--db", srv.db)
    assert doc["agent"] == "support" and doc["output"] == "Order A-17 has shipped."
    assert [(t["name"], t["arguments"], t["id"]) for t in doc["tools"]] == [
        ("lookup_order", {"order_id": "A-17"}, "call_o")]
    assert "shipped" in json.dumps(doc["tools"][0]["result"])
    _assert_server_joins(_spans(capsys, srv.db, doc["trace_id"]))
