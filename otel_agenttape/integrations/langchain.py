"""LangGraph and LangChain recorded as a tape: a callback handler that turns their callbacks into
capture events.

    handler = AgentTapeCallbackHandler(tape)
    graph.invoke(inputs, config={"callbacks": [handler], "metadata": {"session_id": "s-1"}})

What maps to what: the outermost chain (a compiled graph, an agent, any runnable) is a run
(``invoke_agent {name}``); a LangGraph node is a span ``node {name}`` (``agenttape.graph.node``,
``agenttape.graph.step``) that holds the node's model and tool calls; a chat model or LLM call is a
model node (prompt, output, tool calls, usage); a tool is a tool node with its arguments and the
model's tool call id; a subgraph (a graph run inside a node) is a child run under that node. Other
chains (prompts, sequences, routers) record nothing of their own. The session is the config's
``metadata["session_id"]`` (else ``thread_id``, else the handler's ``session_id``); the run id is
``metadata["agenttape.run.id"]``, else LangChain's run id of the outermost chain.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from otel_agenttape import semconv as sc
from otel_agenttape.capture.api import current_run
from otel_agenttape.capture.events import AgentEvent, EventType

from ._common import parse_json

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import BaseMessage, convert_to_openai_messages
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError('LangChain is needed: pip install "otel-agenttape[langgraph]"') from exc

RUN_ID_KEY = "agenttape.run.id"


@dataclass
class _Run:
    run_id: str
    agent: str
    session_id: str | None
    span: Any
    step: int = 0
    framework: str = "langchain"


@dataclass
class _Chain:
    """Every callback run we see, for ancestry: what it is and the OTel span it holds, if any."""

    parent: str | None
    name: str
    start_ns: int
    metadata: dict[str, Any]
    kind: str = "chain"  # "run" | "node" | "chain" | "model" | "tool"
    run: _Run | None = None
    span: Any = None
    inputs: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def _messages(value: Any) -> list[dict[str, Any]]:
    """LangChain messages (or a state holding them) as OpenAI chat messages; LangGraph also takes OpenAI
    dicts ({"role": ..., "content": ...}) as a state's messages."""
    if isinstance(value, dict) and "messages" in value:
        value = value["messages"]
    if isinstance(value, BaseMessage):
        value = [value]
    if isinstance(value, list) and value and all(
            isinstance(m, BaseMessage) or (isinstance(m, dict) and isinstance(m.get("role"), str)) for m in value):
        return list(convert_to_openai_messages(value))
    return []


def _as_input(value: Any) -> Any:
    messages = _messages(value)
    if messages:
        return messages
    if isinstance(value, dict):
        for key in ("input", "question", "query"):
            if isinstance(value.get(key), str):
                return value[key]
    return value if isinstance(value, (str, dict, list)) else None


def _as_output(value: Any) -> Any:
    messages = _messages(value)
    if messages:
        last = messages[-1]
        content = last.get("content")
        return content if isinstance(content, str) else last
    if isinstance(value, dict):
        for key in ("output", "answer", "result"):
            if key in value and isinstance(value[key], (str, dict, list)):
                return value[key]
    return value if isinstance(value, (str, dict, list)) else None


def _error(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_graph_node(name: str, metadata: dict[str, Any], tags: list[str] | None) -> bool:
    return bool(metadata.get("langgraph_node")) and metadata.get("langgraph_node") == name and any(
        str(t).startswith("graph:step:") for t in tags or [])


class AgentTapeCallbackHandler(BaseCallbackHandler):
    """Records LangGraph/LangChain runs through ``tape``'s capture listener.

    Pass it in ``config={"callbacks": [handler]}`` (or a runnable's ``with_config``). One handler can
    serve many concurrent runs. Every callback is guarded: a failure is counted in
    ``tape.stats()["listener_errors"]`` and never reaches the graph.
    """

    raise_error = False
    run_inline = True

    def __init__(self, tape: Any, *, session_id: str | None = None, agent: str | None = None) -> None:
        self.tape = tape
        self.listener = tape.listener
        self._stats = tape.listener.stats
        self.tracer = tape.listener.tracer
        self.session_id = session_id
        self.agent = agent
        self._lock = threading.RLock()
        self._chains: dict[str, _Chain] = {}

    # ---- helpers ---------------------------------------------------------------------------
    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            with self._lock:
                fn(*args)
        except Exception:
            self._stats.incr("listener_errors")

    def _holder(self, parent: str | None) -> _Chain | None:
        """The nearest ancestor that holds an OTel span (a run or a graph node)."""
        seen: set[str] = set()
        cur = parent
        while cur and cur not in seen:
            seen.add(cur)
            chain = self._chains.get(cur)
            if chain is None:
                return None
            if chain.span is not None and chain.kind in ("run", "node", "tool"):
                return chain
            cur = chain.parent
        return None

    def _event(self, kind: EventType, run: _Run, **fields: Any) -> AgentEvent:
        return AgentEvent(kind, run.run_id, run.session_id, None, agent=run.agent, **fields)

    def _start_run(self, key: str, chain: _Chain, parent: _Chain | None, *, run_id: str | None = None,
                   framework: str = "langchain") -> _Run:
        md = chain.metadata
        session = md.get("session_id") or md.get("thread_id") or self.session_id
        parent_run_id = None
        context = None
        if parent is not None and parent.run is not None:
            parent_run_id = parent.run.run_id
            session = session or parent.run.session_id
            context = trace.set_span_in_context(parent.span)
        else:
            outer = current_run()
            if outer is not None:
                parent_run_id = outer.run_id
                session = session or outer.session_id
        rid = run_id or str(md.get(RUN_ID_KEY) or key) if parent is None else (run_id or key)
        agent = (self.agent if parent is None and self.agent else None) or chain.name
        run = _Run(rid, agent, str(session) if session is not None else None, None, framework=framework)
        event = self._event(EventType.RUN_START, run, payload=_as_input(chain.inputs), parent_run_id=parent_run_id,
                            attributes={sc.FRAMEWORK: framework})
        event.time_ns = chain.start_ns
        run.span = self.listener.dispatch(event, context=context)
        chain.kind, chain.run, chain.span = "run", run, run.span
        return run

    def _end_run(self, chain: _Chain, outputs: Any, error: str | None) -> None:
        run = chain.run
        event = self._event(EventType.RUN_END, run, payload=_as_output(outputs) if outputs is not None else None,
                            status=sc.STATUS_ERROR if error else sc.STATUS_COMPLETED, error=error)
        self.listener.dispatch(event)

    # ---- chains: runs, graph nodes, subgraphs ------------------------------------------------
    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                       tags: list[str] | None = None, metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._guard(self._chain_start, serialized, inputs, run_id, parent_run_id, tags, metadata, kwargs)

    def _chain_start(self, serialized: Any, inputs: Any, run_id: UUID, parent_run_id: UUID | None,
                     tags: list[str] | None, metadata: dict[str, Any] | None, kwargs: dict[str, Any]) -> None:
        key, parent = str(run_id), str(parent_run_id) if parent_run_id else None
        name = kwargs.get("name") or (serialized or {}).get("name") or "chain"
        md = dict(metadata or {})
        chain = _Chain(parent, str(name), time.time_ns(), md, inputs=inputs)
        self._chains[key] = chain
        if parent is None or parent not in self._chains:
            framework = "langgraph" if md.get("ls_integration") == "langgraph" or md.get("langgraph_node") \
                else "langchain"
            self._start_run(key, chain, None, framework=framework)
            return
        if not _is_graph_node(chain.name, md, tags):
            return
        holder = self._holder(parent)
        if holder is None:
            return
        if holder.kind == "node":
            # a graph node whose nearest holder is a node of the outer graph: the chain just below that
            # node is a subgraph, a child run
            sub_key = self._child_below(parent, holder)
            if sub_key is not None:
                sub = self._chains[sub_key]
                holder = sub if sub.kind == "run" else self._sub_run(sub_key, sub, holder)
        run = holder.run
        step = md.get("langgraph_step")
        attrs = {sc.GRAPH_NODE: chain.name, sc.GEN_AI_AGENT_NAME: run.agent}
        if isinstance(step, int):
            attrs[sc.GRAPH_STEP] = step
        if self.tracer is not None:
            chain.span = self.tracer.start_span(f"node {chain.name}", context=trace.set_span_in_context(holder.span),
                                                kind=SpanKind.INTERNAL, attributes=attrs, start_time=chain.start_ns)
        chain.kind, chain.run = "node", run

    def _child_below(self, start: str, holder: _Chain) -> str | None:
        cur, below = start, None
        while cur and self._chains.get(cur) is not holder:
            below = cur
            cur = self._chains[cur].parent
        return below

    def _sub_run(self, key: str, chain: _Chain, node: _Chain) -> _Chain:
        self._start_run(key, chain, node, framework="langgraph")
        return chain

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._guard(self._chain_end, str(run_id), outputs, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._guard(self._chain_end, str(run_id), None, _error(error))

    def _chain_end(self, key: str, outputs: Any, error: str | None) -> None:
        chain = self._chains.get(key)
        if chain is None:
            return
        if chain.kind == "run":
            self._end_run(chain, outputs, error)
        elif chain.kind == "node" and chain.span is not None:
            if error and not _is_interrupt(error):
                chain.span.set_status(Status(StatusCode.ERROR, error))
            chain.span.end()
        if chain.parent is None or chain.kind == "run" and chain.parent not in self._chains:
            self._forget(key)

    def _forget(self, root: str) -> None:
        """A root run ended: drop what was kept for its ancestry."""
        tree = {root}
        changed = True
        while changed:
            changed = False
            for k, c in self._chains.items():
                if k not in tree and c.parent in tree:
                    tree.add(k)
                    changed = True
        for k in tree:
            self._chains.pop(k, None)

    # ---- model calls -------------------------------------------------------------------------
    def on_chat_model_start(self, serialized: Any, messages: list[list[Any]], *, run_id: UUID,
                            parent_run_id: UUID | None = None, tags: list[str] | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._guard(self._model_start, serialized, messages, run_id, parent_run_id, metadata, kwargs)

    def on_llm_start(self, serialized: Any, prompts: list[str], *, run_id: UUID, parent_run_id: UUID | None = None,
                     tags: list[str] | None = None, metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        messages = [[{"role": "user", "content": p}] for p in prompts]
        self._guard(self._model_start, serialized, messages, run_id, parent_run_id, metadata, kwargs)

    def _owner(self, key: str, parent: str | None, name: str, md: dict[str, Any], inputs: Any) -> _Chain | None:
        """The holder a model or tool call goes under; a call outside any chain is its own run."""
        holder = self._holder(parent)
        if holder is not None:
            return holder
        if parent is not None and parent in self._chains:
            return None
        root = _Chain(None, name, time.time_ns(), md, inputs=inputs)
        self._chains[f"run:{key}"] = root
        self._start_run(key, root, None)
        return root

    def _model_start(self, serialized: Any, messages: list[list[Any]], run_id: UUID, parent_run_id: UUID | None,
                     metadata: dict[str, Any] | None, kwargs: dict[str, Any]) -> None:
        key, parent = str(run_id), str(parent_run_id) if parent_run_id else None
        md = dict(metadata or {})
        params = dict(kwargs.get("invocation_params") or {})
        model = params.get("model") or params.get("model_name") or md.get("ls_model_name") or params.get("_type")
        prompt = [_messages(batch) or batch for batch in messages][0] if messages else []
        holder = self._owner(key, parent, str(model or "llm"), md, prompt)
        if holder is None:
            return
        run = holder.run
        run.step += 1
        request: dict[str, Any] = {"model": model, "messages": prompt}
        tools = params.get("tools")
        if tools:
            request["tools"] = tools
        for name in ("temperature", "top_p", "max_tokens"):
            if params.get(name) is not None:
                request[name] = params[name]
        self.listener.dispatch(self._event(EventType.MODEL_REQUEST, run, step=run.step, payload=request, model=model,
                                           provider=md.get("ls_provider")),
                               context=trace.set_span_in_context(holder.span))
        self._chains[key] = _Chain(parent, str(model), time.time_ns(), md, kind="model", run=run,
                                   extra={"step": run.step})

    def on_llm_new_token(self, token: str, *, run_id: UUID, **kwargs: Any) -> None:
        def delta() -> None:
            chain = self._chains.get(str(run_id))
            if chain is not None and chain.kind == "model" and token:
                chain.extra["streamed"] = True
                self.listener.dispatch(self._event(EventType.MODEL_RESPONSE, chain.run, step=chain.extra["step"],
                                                   text=token))
        self._guard(delta)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._guard(self._model_end, str(run_id), response, None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._guard(self._model_end, str(run_id), None, _error(error))

    def _model_end(self, key: str, response: Any, error: str | None) -> None:
        chain = self._chains.pop(key, None)
        if chain is None or chain.kind != "model":
            return
        run, step = chain.run, chain.extra["step"]
        if response is not None:
            gen = (response.generations or [[None]])[0][0] if response.generations else None
            message = getattr(gen, "message", None)
            text, calls, usage, raw, model = (getattr(gen, "text", "") or ""), None, None, None, None
            if message is not None:
                out = convert_to_openai_messages(message)
                text = out.get("content") if isinstance(out.get("content"), str) else text
                calls = out.get("tool_calls") or None
                usage = getattr(message, "usage_metadata", None)
                meta = getattr(message, "response_metadata", None) or {}
                model = meta.get("model_name") or meta.get("model")
                raw = out
            if usage is None and isinstance(response.llm_output, dict):
                usage = response.llm_output.get("token_usage") or response.llm_output.get("usage")
            details: dict[str, Any] = {}
            if calls:
                details["tool_calls"] = calls
            if model:
                details["response_model"] = model
            self.listener.dispatch(self._event(
                EventType.MODEL_RESPONSE, run, step=step, text=None if chain.extra.get("streamed") else (text or None),
                payload=raw, usage=dict(usage) if usage else None, details=details or None))
        self.listener.dispatch(self._event(EventType.STEP_END, run, step=step, error=error))
        if f"run:{key}" in self._chains:
            self._end_run(self._chains.pop(f"run:{key}"), response and _first_text(response), error)

    # ---- tools -------------------------------------------------------------------------------
    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID, parent_run_id: UUID | None = None,
                      tags: list[str] | None = None, metadata: dict[str, Any] | None = None,
                      inputs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._guard(self._tool_start, serialized, input_str, run_id, parent_run_id, metadata, inputs, kwargs)

    def _tool_start(self, serialized: Any, input_str: str, run_id: UUID, parent_run_id: UUID | None,
                    metadata: dict[str, Any] | None, inputs: dict[str, Any] | None, kwargs: dict[str, Any]) -> None:
        key, parent = str(run_id), str(parent_run_id) if parent_run_id else None
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        arguments = inputs if inputs is not None else parse_json(input_str)
        holder = self._owner(key, parent, str(name), dict(metadata or {}), arguments)
        if holder is None:
            return
        run = holder.run
        call_id = kwargs.get("tool_call_id")
        span = self.listener.dispatch(self._event(EventType.TOOL_CALL, run, step=run.step, tool_name=str(name),
                                                  call_id=call_id, payload=arguments),
                                      context=trace.set_span_in_context(holder.span), pair=key)
        self._chains[key] = _Chain(parent, str(name), time.time_ns(), dict(metadata or {}), kind="tool", run=run,
                                   span=span, extra={"step": run.step, "call_id": call_id})

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._guard(self._tool_end, str(run_id), output, None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._guard(self._tool_end, str(run_id), None, _error(error))

    def _tool_end(self, key: str, output: Any, error: str | None) -> None:
        chain = self._chains.pop(key, None)
        if chain is None or chain.kind != "tool":
            return
        result = getattr(output, "content", output)
        call_id = chain.extra["call_id"] or getattr(output, "tool_call_id", None)
        if getattr(output, "status", None) == "error" and error is None:
            error = str(result)
        self.listener.dispatch(self._event(EventType.TOOL_RESULT, chain.run, step=chain.extra["step"],
                                           tool_name=chain.name, call_id=call_id,
                                           payload=parse_json(result) if isinstance(result, str) else result,
                                           error=error), pair=key)
        if f"run:{key}" in self._chains:
            self._end_run(self._chains.pop(f"run:{key}"), result if isinstance(result, str) else None, error)


def _first_text(response: Any) -> str | None:
    try:
        return response.generations[0][0].text or None
    except (AttributeError, IndexError):
        return None


def _is_interrupt(error: str) -> bool:
    return error.startswith("GraphInterrupt") or error.startswith("ParentCommand")
