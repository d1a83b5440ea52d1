"""An MCP server over stdio for the integration tests: ``lookup_order`` answers from a table, and
its spans (the MCP SDK's own ``tools/call`` server span, plus one of the tool's) go to the receiver
named by ``AGENTTAPE_TEST_RECEIVER``, so they join the calling agent's trace."""

from __future__ import annotations

import os

import otel_agenttape
from mcp.server.mcpserver import MCPServer
from opentelemetry import trace

ORDERS = {"A-17": {"order": "A-17", "status": "shipped", "eta": "2026-12-03"}}

tape = otel_agenttape.setup(os.environ["AGENTTAPE_TEST_RECEIVER"], service_name="orders-mcp", set_global=True)
server = MCPServer("orders")


@server.tool()
def lookup_order(order_id: str) -> dict:
    """The status of an order."""
    with trace.get_tracer("orders").start_as_current_span("orders.db.read", attributes={"order.id": order_id}):
        return ORDERS.get(order_id, {"order": order_id, "status": "unknown"})


if __name__ == "__main__":
    try:
        server.run("stdio")
    finally:
        tape.shutdown()
