"""MCP tool calls as tool nodes whose server side joins the caller's tree.

The ``mcp`` SDK (2.3 and later) carries W3C trace context itself: each request's client span
(``MCP send tools/call {tool}``) injects ``traceparent`` into the request's ``_meta``, and its servers
extract it and wrap each request in a ``tools/call {tool}`` server span (``gen_ai.operation.name =
execute_tool``). Both use the global tracer provider, so:

- in the agent: ``otel_agenttape.setup(..., set_global=True)`` and make the MCP call inside the tool
  node (``call_tool`` below does it; the Agents SDK's MCP servers do it through
  ``AgentTapeProcessor``, whose tool span is current while the SDK calls the server);
- in the server process: ``otel_agenttape.setup(endpoint, service_name="my-server", set_global=True)``
  (or any OTLP exporter on the global provider) before ``server.run()``.

The server's spans then sit under the agent's tool span in one trace; a rebuild counts the server's
``execute_tool`` span as the same call as the tool node above it, not a second one.
"""

from __future__ import annotations

import json
from typing import Any

from otel_agenttape import semconv as sc


def result_value(result: Any) -> Any:
    """A ``CallToolResult`` as a JSON value: its structured content, else the text of its content
    blocks (parsed when it is JSON)."""
    structured = getattr(result, "structured_content", None)
    if structured is None:
        structured = getattr(result, "structuredContent", None)
    if structured is not None:
        return structured
    texts = [getattr(block, "text", None) for block in getattr(result, "content", None) or []]
    text = "".join(t for t in texts if isinstance(t, str))
    try:
        return json.loads(text)
    except ValueError:
        return text


async def call_tool(run: Any, session: Any, name: str, arguments: dict[str, Any] | None = None, *,
                    call_id: str | None = None, server: str | None = None, **kwargs: Any) -> Any:
    """``session.call_tool(name, arguments, **kwargs)`` recorded as a tool node of ``run`` (a capture
    ``Run``), with the MCP request made inside it so the server's spans nest under it. A result with
    ``is_error`` is recorded as the node's error (and still returned, as the SDK returns it)."""
    attributes = {sc.FRAMEWORK_MCP_SERVER: server} if server else None
    with run.tool_call(name, arguments, call_id=call_id, attributes=attributes) as tool:
        result = await session.call_tool(name, arguments, **kwargs)
        value = result_value(result)
        if getattr(result, "is_error", False) or getattr(result, "isError", False):
            tool.error = value if isinstance(value, str) else json.dumps(value)
        else:
            tool.result(value)
    return result
