"""The rebuilt views of a tape: nodes, steps, runs and run trees (their messages are ``codec.messages_read.Message``).

Everything here is plain data rebuilt from stored spans, so it can be printed, compared,
serialized to the `replay --json` contract or turned into a training example without the
objects that produced it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..codec.messages_read import Message


@dataclass
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_write_input_tokens: int | None = None
    reasoning_output_tokens: int | None = None

    def add(self, other: Usage) -> None:
        for name in self.__dataclass_fields__:
            theirs = getattr(other, name)
            if theirs is not None:
                setattr(self, name, (getattr(self, name) or 0) + theirs)

    def to_json(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class ToolCall:
    """A tool call: what the model asked for and, when it ran, what came back."""

    name: str | None
    arguments: Any = None
    result: Any = None
    call_id: str | None = None
    error: str | None = None
    span_id: str | None = None
    executed: bool = False
    answered: bool = False  # its result came back to the model in a tool_call_response

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "arguments": self.arguments, "result": self.result}
        if self.call_id:
            out["id"] = self.call_id
        if self.error:
            out["error"] = self.error
        if not self.executed and not self.answered:
            out["ran"] = False  # requested, but no tool span and no response: it never ran (or is running)
        return out


@dataclass(slots=True)
class Node:
    """One model call or tool execution (or another span kept for context), rebuilt from a span."""

    node_type: str  # "model" | "tool" | "other"
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    status: str  # "ok" | "error" | "unset"
    status_message: str | None = None
    convention: str = "genai"  # agenttape | genai | openinference | openllmetry
    run_id: str | None = None
    node_id: str | None = None
    turn_id: str | None = None
    step: int | None = None
    # model
    provider: str | None = None
    model: str | None = None
    request_model: str | None = None
    system_instructions: list[Message] = field(default_factory=list)
    input_messages: list[Message] = field(default_factory=list)
    output_messages: list[Message] = field(default_factory=list)
    deltas: list[str] = field(default_factory=list)
    output_text: str = ""
    raw_output: Any = None
    reasoning: str = ""
    retry_count: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    tool_definitions: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    request: dict[str, Any] = field(default_factory=dict)
    # tool
    tool_name: str | None = None
    tool_call_id: str | None = None
    arguments: Any = None
    result: Any = None
    tool_error: str | None = None
    # both
    truncated: list[str] = field(default_factory=list)
    erased: list[str] = field(default_factory=list)  # content erased by ``agenttape erase`` (labels)
    events: list[dict[str, Any]] = field(default_factory=list)
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt(self) -> list[Message]:
        """The messages as sent: system instructions first unless the input already has them."""
        if self.system_instructions and not any(m.role == "system" for m in self.input_messages):
            return list(self.system_instructions) + list(self.input_messages)
        return list(self.input_messages)

    @property
    def requested_tool_calls(self) -> list[dict[str, Any]]:
        return [c for m in self.output_messages for c in m.tool_calls]

    def summary(self) -> dict[str, Any]:
        """A short JSON view used by `show` and `diff`."""
        out: dict[str, Any] = {"type": self.node_type, "name": self.name, "span_id": self.span_id}
        if self.node_type == "model":
            out["model"] = self.model
            out["input"] = [m.to_json() for m in self.prompt]
            out["output"] = self.output_text
            calls = self.requested_tool_calls
            if calls:
                out["tool_calls"] = [
                    {"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
                    for c in calls
                ]
        elif self.node_type == "tool":
            out["tool"] = self.tool_name
            out["arguments"] = self.arguments
            out["result"] = self.result
            if self.tool_error:
                out["error"] = self.tool_error
        out["status"] = self.status
        if self.truncated:
            out["truncated"] = list(self.truncated)
        if self.erased:
            out["erased"] = list(self.erased)
        return out


@dataclass(slots=True)
class Step:
    """One entry of a run's ordered step stream (input, text, tool-start, tool-result, ...)."""

    index: int
    kind: str
    time_ns: int
    span_id: str | None
    payload: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "time_ns": self.time_ns, **self.payload}


@dataclass
class Run:
    """One agent invocation rebuilt from the store."""

    run_id: str
    trace_id: str
    span_id: str | None
    agent: str | None
    status: str
    start_ns: int
    end_ns: int
    status_message: str | None = None
    session_id: str | None = None
    parent_run_id: str | None = None
    previous_run_id: str | None = None  # the run this one follows in its session (not a parent)
    service_name: str | None = None
    convention: str = "agenttape"
    source: str = "agenttape"  # agenttape | otel-genai | openinference | openllmetry | openai-agents | ...
    input: list[Message] = field(default_factory=list)
    output: str = ""
    output_messages: list[Message] = field(default_factory=list)
    input_from: str | None = None  # "model_call": its own spans carry no input, read from a model call
    output_from: str | None = None  # likewise for the output
    tools: list[ToolCall] = field(default_factory=list)
    tool_definitions: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    models: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    erased: list[str] = field(default_factory=list)  # "span_id:label" of content erased by ``agenttape erase``
    children: list[Run] = field(default_factory=list)
    trace_ids: list[str] = field(default_factory=list)

    @property
    def model_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.node_type == "model"]

    @property
    def tool_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.node_type == "tool"]

    @property
    def duration_ms(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e6

    @property
    def ref(self) -> str:
        """``RUN_ID@TRACE_ID``: a run id is unique only together with its trace."""
        return f"{self.run_id}@{self.trace_id}"

    def to_json(self, children: bool = True) -> dict[str, Any]:
        """The `agenttape replay --json` contract (see docs/replay.md)."""
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "ref": self.ref,
            "source": self.source,
            "status": self.status,
            "agent": self.agent,
            "input": [m.to_json() for m in self.input],
            "output": self.output,
            "tools": [t.to_json() for t in self.tools],
            "children": [c.to_json(children) for c in self.children] if children else [],
            "trace_id": self.trace_id,
            "parent_run_id": self.parent_run_id,
            "session_id": self.session_id,
            "models": list(self.models),
            "usage": self.usage.to_json(),
            "start_time_unix_nano": self.start_ns,
            "end_time_unix_nano": self.end_ns,
        }
        if self.previous_run_id:
            out["previous_run_id"] = self.previous_run_id
        if self.input_from:
            out["input_from"] = self.input_from
        if self.output_from:
            out["output_from"] = self.output_from
        if self.status_message:
            out["status_message"] = self.status_message
        if self.truncated:
            out["truncated"] = list(self.truncated)
        if self.erased:
            out["erased"] = list(self.erased)
        return out


@dataclass
class RunTree:
    """A coordinator run and every run it started, transitively, children ordered by start."""

    root: Run

    @property
    def children(self) -> list[Run]:
        return self.root.children

    def runs(self) -> list[Run]:
        out: list[Run] = []
        stack = [self.root]
        while stack:
            run = stack.pop(0)
            out.append(run)
            stack[0:0] = run.children
        return out

    @property
    def run_count(self) -> int:
        return len(self.runs())

    def to_json(self) -> dict[str, Any]:
        return self.root.to_json(children=True)
