"""Cassettes: a recorded run's model and tool outputs served back in recorded order.

An unchanged agent program, given a ``ReplayModelClient`` and a ``ReplayToolExecutor`` in place
of its real model client and tools, re-runs offline and deterministically: each call gets the next
recorded result (streamed deltas included). A call the recording does not hold raises
``UnrecordedCallError``; a call whose request differs from the recorded one raises
``DivergenceError`` carrying a unified diff of the two. The interfaces mirror the resume module's
``ResumableModelClient`` (``create``/``stream``) and ``ResumableToolExecutor`` (``execute``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..codec.jsontext import parse_any_json
from ..codec.messages_read import system_messages, to_messages
from ..resume.errors import DivergenceError, RecordedToolError, UnrecordedCallError
from ..resume.keys import request_diff
from .model import Node, Run
from .rebuild import reconstruct, reconstruct_tree
from .replay import ModelResult, replay_model_mock, replay_tool_mock

MODEL = "model"
TOOL = "tool"


def _reader(source: Any) -> tuple[Any, bool]:
    """A reader for a path, Store or reader; True when we opened it (and must close it)."""
    if hasattr(source, "query"):
        return source, False
    from ..store.reader import open_reader

    return open_reader(source), True


def load_run(source: Any, run_id: str, *, tree: bool = False) -> Run:
    """The rebuilt run; with ``tree`` its child runs too (``Run.children``)."""
    reader, owned = _reader(source)
    try:
        return reconstruct_tree(reader, run_id).root if tree else reconstruct(reader, run_id)
    finally:
        if owned:
            reader.close()


def tree_nodes(run: Run) -> list[Node]:
    """The nodes of a run and all its child runs, in start order (one program driving a team)."""
    nodes: list[Node] = []
    stack = [run]
    while stack:
        current = stack.pop()
        nodes.extend(current.nodes)
        stack.extend(current.children)
    return sorted(nodes, key=lambda n: (n.start_ns, n.step if n.step is not None else -1, n.span_id))


def _request_messages(request: Any) -> list[dict[str, Any]]:
    """A request's prompt (system first) in the comparable ``Message.to_json`` form."""
    request = parse_any_json(request)
    system = None
    messages: Any = request
    if isinstance(request, dict) and ("messages" in request or "system" in request or "input" in request):
        messages = request.get("messages", request.get("input"))
        system = request.get("system", request.get("instructions"))
    out = system_messages(system or None)  # an empty system value is no message
    out += to_messages(messages)
    return [_comparable(m.to_json()) for m in out]


def _comparable(msg: dict[str, Any]) -> dict[str, Any]:
    out = {"role": msg["role"], "content": msg.get("content") or ""}
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "arguments": parse_any_json(c.get("arguments"))}
            for c in msg["tool_calls"]
        ]
    if msg.get("tool_call_id"):
        out["tool_call_id"] = msg["tool_call_id"]
    return out


def _request_model(request: Any) -> str | None:
    return request.get("model") if isinstance(request, dict) else None


class ReplayStream:
    """Iterates the recorded deltas of one model call; ``result`` is set once exhausted."""

    def __init__(self, result: ModelResult) -> None:
        self._result = result
        self.result: ModelResult | None = None
        self.replayed = True

    def __iter__(self) -> Iterator[str]:
        yield from self._result.deltas
        self.result = self._result

    def __enter__(self) -> ReplayStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class ReplayModelClient:
    """Serves a recorded run's model results in recorded order, checking each request."""

    def __init__(self, nodes: list[Node], *, check_requests: bool = True, run: Run | None = None) -> None:
        self.nodes = [n for n in nodes if n.node_type == MODEL]
        self.check_requests = check_requests
        self.run = run
        self.position = 0

    @classmethod
    def from_run(cls, run: Run, **kwargs: Any) -> ReplayModelClient:
        """Serve this run's model calls (and its child runs', when the run was rebuilt as a tree)."""
        return cls(tree_nodes(run), run=run, **kwargs)

    @classmethod
    def from_store(cls, source: Any, run_id: str, *, tree: bool = False, **kwargs: Any) -> ReplayModelClient:
        """``source``: a DuckDB path, a Parquet lake folder, a ``Store`` or a reader; ``tree``: include
        the calls of every child run (a coordinator and its team driven by one program)."""
        return cls.from_run(load_run(source, run_id, tree=tree), **kwargs)

    @property
    def remaining(self) -> int:
        return len(self.nodes) - self.position

    def _next(self, request: Any) -> Node:
        if self.position >= len(self.nodes):
            raise UnrecordedCallError(MODEL, self.position, request)
        node = self.nodes[self.position]
        if self.check_requests and request is not None:
            recorded = [_comparable(m.to_json()) for m in node.prompt]
            current = _request_messages(request)
            model = _request_model(request)
            rec_model = node.request_model
            if current != recorded or (model and rec_model and model != rec_model):
                rec = {"model": rec_model, "messages": recorded}
                cur = {"model": model or rec_model, "messages": current}
                raise DivergenceError(MODEL, self.position, rec, cur, request_diff(rec, cur))
        self.position += 1
        return node

    def create(self, request: Any = None, **kwargs: Any) -> ModelResult:
        """The next recorded model result (raw payload in ``.raw``, text in ``.text``)."""
        request = request if request is not None else (kwargs or None)
        return replay_model_mock(self._next(request))

    __call__ = create

    def stream(self, request: Any = None, **kwargs: Any) -> ReplayStream:
        """The next recorded call as its streamed deltas, then ``.result``."""
        request = request if request is not None else (kwargs or None)
        return ReplayStream(replay_model_mock(self._next(request)))

    def assert_consumed(self) -> None:
        if self.remaining:
            raise AssertionError(f"{self.remaining} recorded model call(s) were not replayed")


class ReplayToolExecutor:
    """Serves a recorded run's tool results in recorded order, checking name and arguments."""

    def __init__(self, nodes: list[Node], *, check_arguments: bool = True, run: Run | None = None) -> None:
        self.nodes = [n for n in nodes if n.node_type == TOOL]
        self.check_arguments = check_arguments
        self.run = run
        self.position = 0
        self._used: set[int] = set()

    @classmethod
    def from_run(cls, run: Run, **kwargs: Any) -> ReplayToolExecutor:
        return cls(tree_nodes(run), run=run, **kwargs)

    @classmethod
    def from_store(cls, source: Any, run_id: str, *, tree: bool = False, **kwargs: Any) -> ReplayToolExecutor:
        return cls.from_run(load_run(source, run_id, tree=tree), **kwargs)

    @property
    def remaining(self) -> int:
        return len(self.nodes) - len(self._used)

    def _next(self, name: str, arguments: Any, call_id: str | None) -> Node:
        index = None
        if call_id is not None:
            index = next(
                (i for i, n in enumerate(self.nodes) if i not in self._used and n.tool_call_id == call_id), None
            )
        if index is None:
            index = next((i for i in range(len(self.nodes)) if i not in self._used), None)
        current = {"name": name, "arguments": parse_any_json(arguments)}
        if index is None:
            raise UnrecordedCallError(TOOL, len(self._used), current)
        node = self.nodes[index]
        recorded = {"name": node.tool_name, "arguments": node.arguments}
        if name != node.tool_name or (self.check_arguments and current["arguments"] != node.arguments):
            raise DivergenceError(TOOL, len(self._used), recorded, current, request_diff(recorded, current))
        self._used.add(index)
        self.position = len(self._used)
        return node

    def execute(self, name: str, arguments: Any = None, *, call_id: str | None = None) -> Any:
        """The recorded result of this call; a recorded failure raises ``RecordedToolError``."""
        return replay_tool_mock(self._next(name, arguments, call_id))

    __call__ = execute

    def tool(self, name: str) -> Any:
        """A stand-in function for one tool: ``fn(**arguments)`` returns the recorded result."""

        def fn(**arguments: Any) -> Any:
            return self.execute(name, arguments)

        fn.__name__ = name
        return fn

    def assert_consumed(self) -> None:
        if self.remaining:
            raise AssertionError(f"{self.remaining} recorded tool call(s) were not replayed")


class Cassette:
    """A recorded run ready to drive a test: ``model``, ``tools`` and the rebuilt ``run``."""

    def __init__(self, run: Run, *, check_requests: bool = True) -> None:
        self.run = run
        self.model = ReplayModelClient.from_run(run, check_requests=check_requests)
        self.tools = ReplayToolExecutor.from_run(run, check_arguments=check_requests)

    @classmethod
    def from_store(cls, source: Any, run_id: str, *, tree: bool = False, **kwargs: Any) -> Cassette:
        """With ``tree`` the cassette also serves the calls of the run's child runs."""
        return cls(load_run(source, run_id, tree=tree), **kwargs)

    @property
    def output(self) -> str:
        return self.run.output

    def assert_consumed(self) -> None:
        self.model.assert_consumed()
        self.tools.assert_consumed()


__all__ = [
    "Cassette",
    "DivergenceError",
    "RecordedToolError",
    "ReplayModelClient",
    "ReplayStream",
    "ReplayToolExecutor",
    "UnrecordedCallError",
]
