"""Framework adapters: the OpenAI Agents SDK, LangGraph/LangChain and MCP recorded as tapes.

Each adapter lives in its own module and imports its framework only there, so ``import
otel_agenttape.integrations`` needs none of them (``pip install "otel-agenttape[openai-agents]"``,
``[langgraph]``, ``[mcp]``). Adapters feed the capture listener, so their runs are sealed, exported
and resumable like any other tape.

- ``openai_agents``: ``AgentTapeProcessor`` (a ``TracingProcessor``), ``instrument_openai_agents``
- ``openai_agents_resume``: ``ResumableModel``, ``resumable_tools``
- ``langchain``: ``AgentTapeCallbackHandler``
- ``langchain_resume``: ``resumable_chat_model``, ``resumable_tool``
- ``mcp``: ``call_tool`` (an MCP tool call as a tool node whose server spans join the tree)
"""
