"""Open runs and nodes: which events belong together, and what a node gathers until it completes.

Pairing: model nodes pair MODEL_REQUEST/MODEL_RESPONSE on ``run|turn|step`` and complete at STEP_END;
tool nodes pair TOOL_CALL/TOOL_RESULT on ``run|turn|step|callId`` (falling back to the tool name, then
``anon``) and complete at TOOL_RESULT; a TOOL_RESULT without a TOOL_CALL is still captured, without
input. Accumulation: streamed text is concatenated while the raw payload keeps only the latest
non-empty one; reasoning segments are joined by newlines; retries are counted per step.

Nothing here starts or ends a span or knows an attribute name: a node carries its span for the span
mapping (``span_mapping.py``) to use. ``OpenNodes`` is not thread-safe; the listener holds its lock.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_agenttape.capture.events import AgentEvent
from otel_agenttape.codec.messages_record import convert_message, describe_response, map_finish_reason
from otel_agenttape.capture.records import MODEL, TOOL, NodeRecord
from otel_agenttape.capture.usage import Usage, parse_usage
from otel_agenttape.codec.jsontext import to_plain

#: Request parameters read from a prompt mapping (the span mapping names their attributes).
REQUEST_PARAMS = ("max_tokens", "max_output_tokens", "max_completion_tokens", "temperature", "top_p", "stream")


def new_id() -> str:
    # Unique record ids without a syscall per node (uuid4 reads os.urandom each time).
    return f"{random.getrandbits(128):032x}"


def ms(time_ns: int) -> int:
    return time_ns // 1_000_000


def step_key(e: AgentEvent) -> str:
    return f"{e.run_id}|{e.turn_id if e.turn_id is not None else ''}|{e.step if e.step is not None else ''}"


def tool_part(e: AgentEvent, pair: str | None) -> str:
    """What pairs a tool call with its result within a step: the caller's token, the call id, the tool
    name, or ``anon``."""
    return pair or e.call_id or e.tool_name or "anon"


def tool_key(e: AgentEvent, part: str) -> str:
    return f"{step_key(e)}|{part}"


@dataclass(slots=True)
class RunState:
    run_id: str
    span: Any
    agent: str | None
    session_id: str | None
    status: str | None = None
    error: str | None = None
    parent_run_id: str | None = None  # also on the run's node spans: a child that dies before its run
    # span ends (another process) still names its parent run


@dataclass(slots=True)
class ModelRequest:
    """A MODEL_REQUEST payload read: a prompt mapping (``messages``/``contents``/``input``, ``system``,
    ``tools``, request parameters) or a plain message list, which is all ``messages``."""

    model: str | None
    provider: str | None
    messages: Any
    system: Any = None
    tools: Any = None
    params: dict[str, Any] = field(default_factory=dict)


def read_request(e: AgentEvent, inputs: Any) -> ModelRequest:
    prompt = to_plain(inputs)
    if (type(prompt) is dict or isinstance(prompt, Mapping)) and (
            "messages" in prompt or "model" in prompt or "contents" in prompt):
        return ModelRequest(
            model=e.model or prompt.get("model"),
            provider=e.provider or prompt.get("provider"),
            messages=prompt.get("messages", prompt.get("contents", prompt.get("input"))),
            system=prompt.get("system", prompt.get("system_instruction", prompt.get("instructions"))),
            tools=prompt.get("tools"),
            params={k: prompt[k] for k in REQUEST_PARAMS if k in prompt},
        )
    return ModelRequest(e.model, e.provider, prompt)


@dataclass(slots=True)
class ModelNode:
    record: NodeRecord
    span: Any
    provider: str | None = None
    seq: int = 0  # the last span event's sequence number
    texts: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    response_model: str | None = None
    response_id: str | None = None
    responses: int = 0
    truncated: list[str] = field(default_factory=list)  # content attributes that were cut

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def note_response(self, model: str | None) -> None:
        self.responses += 1
        if model and not self.response_model:
            self.response_model = model

    def add_text(self, text: str) -> int:
        """A streamed text delta; its event's sequence number."""
        self.texts.append(text)
        return self.next_seq()

    def add_reasoning(self, text: str) -> int:
        self.reasoning.append(text)
        return self.next_seq()

    def absorb(self, e: AgentEvent) -> None:
        """What a MODEL_RESPONSE says besides its text delta: the raw payload (latest non-empty one
        wins), usage (later present values win) and the caller's ``details``."""
        raw = to_plain(e.payload)
        if not _is_empty(raw):
            self.record.outputs = raw
            info = describe_response(raw)
            if info["model"]:
                self.response_model = info["model"]
            if info["id"]:
                self.response_id = info["id"]
            if info["finish_reason"]:
                self.finish_reason = info["finish_reason"]
            if info["tool_calls"]:
                self.tool_calls = info["tool_calls"]
            if info["reasoning"] and not self.reasoning:
                self.reasoning.append(info["reasoning"])
            if info["text"] and not e.text and not self.texts:
                self.texts.append(info["text"])
            self.usage.merge(parse_usage(raw))
        if e.usage:
            self.usage.merge(parse_usage(to_plain(e.usage)))
        if e.details:
            d = e.details
            if d.get("tool_calls") is not None:
                self.tool_calls = convert_message({"role": "assistant", "tool_calls": list(d["tool_calls"])})["parts"]
            if d.get("finish_reason"):
                self.finish_reason = map_finish_reason(d["finish_reason"])
            if d.get("response_model"):
                self.response_model = d["response_model"]
            if d.get("response_id"):
                self.response_id = d["response_id"]

    def complete(self, time_ns: int, error: str | None) -> NodeRecord:
        rec = self.record
        rec.output_text = "".join(self.texts)
        rec.reasoning_text = "\n".join(self.reasoning)
        rec.input_tokens = self.usage.input_tokens
        rec.output_tokens = self.usage.output_tokens
        rec.captured_at_ms = ms(time_ns)
        rec.error = error
        return rec


@dataclass(slots=True)
class ToolNode:
    record: NodeRecord
    span: Any
    key: str
    truncated: list[str] = field(default_factory=list)

    def complete(self, e: AgentEvent, result: Any, error: str | None) -> NodeRecord:
        rec = self.record
        if rec.tool_name is None and e.tool_name:
            rec.tool_name = e.tool_name
        if rec.call_id is None and e.call_id:
            rec.call_id = e.call_id
        rec.outputs = to_plain(result)
        rec.output_text = result if isinstance(result, str) else ""
        rec.captured_at_ms = ms(e.time_ns)
        rec.error = error
        return rec


def _record(e: AgentEvent, run: RunState | None, node_type: str, node_id: str, **fields: Any) -> NodeRecord:
    return NodeRecord(
        record_id=new_id(), run_id=e.run_id,
        session_id=e.session_id if e.session_id is not None else (run.session_id if run else None),
        turn_id=e.turn_id, step=e.step, node_type=node_type, node_id=node_id,
        started_at_ms=ms(e.time_ns), **fields,
    )


class OpenNodes:
    """Every run and node that has started and not completed, and the retry count of each step."""

    __slots__ = ("runs", "models", "tools", "retries")

    def __init__(self) -> None:
        self.runs: dict[str, RunState] = {}
        self.models: dict[str, ModelNode] = {}  # by step key
        self.tools: dict[str, deque[ToolNode]] = {}  # by tool key, oldest call first
        self.retries: dict[str, int] = {}  # by step key

    def counts(self) -> dict[str, int]:
        return {"runs": len(self.runs), "model_nodes": len(self.models),
                "tool_nodes": sum(len(q) for q in self.tools.values())}

    # ---- runs ------------------------------------------------------------------------------
    def close_run(self, run_id: str) -> tuple[list[str], list[ToolNode], RunState | None]:
        """Forget a run: the step keys of its open model nodes (still open, for the caller to complete
        in this order), its open tool nodes (removed), its retry counts, and its state."""
        prefix = f"{run_id}|"
        model_keys = [k for k in self.models if k.startswith(prefix)]
        tools = [node for key in [k for k in self.tools if k.startswith(prefix)] for node in self.tools.pop(key)]
        for key in [k for k in self.retries if k.startswith(prefix)]:
            del self.retries[key]
        return model_keys, tools, self.runs.pop(run_id, None)

    # ---- model nodes -----------------------------------------------------------------------
    def new_model(self, e: AgentEvent, key: str, inputs: Any) -> tuple[ModelNode, ModelRequest]:
        """A model node for the step ``key`` (not yet added: its span comes first)."""
        request = read_request(e, inputs)
        record = _record(e, self.runs.get(e.run_id), MODEL, f"model@{key}", model_id=request.model,
                         inputs=inputs, retry_count=self.retries.get(key, 0))
        return ModelNode(record, None, provider=request.provider), request

    def count_retry(self, key: str) -> int:
        count = self.retries.get(key, 0) + 1
        self.retries[key] = count
        return count

    # ---- tool nodes ------------------------------------------------------------------------
    def new_tool(self, e: AgentEvent, key: str, arguments: Any) -> ToolNode:
        record = _record(e, self.runs.get(e.run_id), TOOL, f"tool@{key}", tool_name=e.tool_name,
                         call_id=e.call_id, inputs=arguments)
        return ToolNode(record, None, key)

    def push_tool(self, node: ToolNode) -> None:
        self.tools.setdefault(node.key, deque()).append(node)

    def pop_tool(self, e: AgentEvent, pair: str | None = None) -> ToolNode | None:
        """The open call a TOOL_RESULT answers, removed; None when there is none."""
        candidates = [pair] if pair else [p for p in (e.call_id, e.tool_name, "anon") if p]
        for part in candidates:
            queue = self.tools.get(tool_key(e, part))
            if queue:
                node = queue.popleft()
                if not queue:
                    del self.tools[node.key]
                return node
        if not e.call_id and not pair:
            # Result without a call id: the oldest open call of that tool in this step.
            prefix = step_key(e) + "|"
            for key, queue in self.tools.items():
                if key.startswith(prefix) and queue and queue[0].record.tool_name == e.tool_name:
                    node = queue.popleft()
                    if not queue:
                        del self.tools[key]
                    return node
        return None


def _is_empty(raw: Any) -> bool:
    return raw is None or raw == "" or (isinstance(raw, (dict, list, tuple)) and len(raw) == 0)
