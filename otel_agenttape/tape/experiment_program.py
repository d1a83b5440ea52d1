"""Program-level experiments: the user's agent program runs again on each recorded run's input, with the
candidate model live and tools served from the tape.

A tool call that matches a recorded one (same name and arguments, in any order) gets the recorded result
and no tool runs. Any other call follows ``tools``: ``"tape"`` fails it as diverged
(``ToolDivergedError``), ``"live"`` calls the real tool from ``live``, ``"mock"`` calls ``mock(name,
arguments)``. A recorded side effect is never repeated unless a real tool is asked for.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..resume.entry import COMMITTED, FAILED, Entry
from ..resume.errors import DivergenceError
from ..resume.journal import Journal
from ..resume.keys import canonical_json, request_hash
from .cassette import tree_nodes
from .experiment import (
    EXPERIMENT_KIND,
    EXPERIMENT_MODEL,
    EXPERIMENT_NAME,
    EXPERIMENT_NODE,
    EXPERIMENT_OF,
    EXPERIMENT_SERVICE,
    JOURNAL_KIND,
    Candidate,
    ExperimentError,
    ExperimentResult,
    _error_text,
    check_name,
    default_endpoint,
    default_journal,
    experiment_refs,
)
from .model import Node, Run
from .replay import replay_tool_mock

POLICIES = ("tape", "live", "mock")


class ToolDivergedError(DivergenceError):
    """The program called a tool the tape has no matching call for, under ``tools="tape"``."""

    def __init__(self, name: str, arguments: Any) -> None:
        self.name, self.arguments = name, arguments
        Exception.__init__(self, f"tool call {name}({canonical_json(arguments).decode()}) is not on the tape")

    def __str__(self) -> str:
        return str(self.args[0])


def _key(name: str, arguments: Any) -> tuple[str, bytes]:
    return name, canonical_json(arguments if arguments is not None else {})


@dataclass
class TapeTools:
    """Tool results from the recorded run, matched by name and arguments; the counters say what ran."""

    nodes: Sequence[Node]
    policy: str = "tape"
    live: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    mock: Callable[[str, Any], Any] | None = None
    served: int = 0
    live_calls: int = 0
    mocked: int = 0
    diverged: list[tuple[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ExperimentError(f"tools={self.policy!r}: one of {', '.join(POLICIES)}")
        if self.policy == "mock" and self.mock is None:
            raise ExperimentError('tools="mock" needs mock=fn(name, arguments)')
        self._pool: dict[tuple[str, bytes], deque[Node]] = {}
        self._last: dict[tuple[str, bytes], Node] = {}
        for node in self.nodes:
            if node.node_type == "tool" and node.tool_name:
                self._pool.setdefault(_key(node.tool_name, node.arguments), deque()).append(node)

    def execute(self, name: str, arguments: Any = None, *, call_id: str | None = None) -> Any:
        """The recorded result of this call, or what the policy gives for a call the tape does not hold."""
        key = _key(name, arguments)
        queue = self._pool.get(key)
        node = queue.popleft() if queue else self._last.get(key)
        if node is not None:
            self._last[key] = node
            self.served += 1
            return replay_tool_mock(node)
        self.diverged.append((name, arguments))
        if self.policy == "live" and name in self.live:
            self.live_calls += 1
            fn = self.live[name]
            return fn(**arguments) if isinstance(arguments, dict) else fn(arguments)
        if self.policy == "mock":
            self.mocked += 1
            return self.mock(name, arguments)  # type: ignore[misc]
        raise ToolDivergedError(name, arguments)

    def tool(self, name: str) -> Callable[..., Any]:
        """``name`` as a plain function of keyword arguments (for frameworks that take callables)."""

        def fn(**arguments: Any) -> Any:
            return self.execute(name, arguments)

        fn.__name__ = name
        return fn


@dataclass
class ProgramContext:
    """What the user's program gets for one recorded run."""

    original: Run
    input: str
    messages: list[dict[str, Any]]
    model: str
    client: Any
    tools: TapeTools
    tape: Any
    run: Any  # the capture Run of the experiment's new run (already entered)


def run_program_experiment(source: Any, name: str, fn: Callable[[ProgramContext], Any], candidate: Candidate, *,
                           refs: Sequence[str] = (), filters: dict[str, Any] | None = None, tools: str = "tape",
                           live: Mapping[str, Callable[..., Any]] | None = None,
                           mock: Callable[[str, Any], Any] | None = None, endpoint: str | None = None,
                           journal: str | os.PathLike[str] | None = None, tape: Any = None, seal: bool = True,
                           limit: int = 1000) -> ExperimentResult:
    """Run ``fn(ctx)`` once per selected recorded run, recording each as an experiment run linked to it."""
    import otel_agenttape

    check_name(name)
    if tools not in POLICIES:
        raise ExperimentError(f"tools={tools!r}: one of {', '.join(POLICIES)}")
    with otel_agenttape.open(source) as tapes:
        chosen = list(refs)
        if not chosen:
            mine = experiment_refs(tapes)
            page = tapes.runs(limit=limit + len(mine), **{k: v for k, v in (filters or {}).items() if v is not None})
            chosen = [r.ref for r in page.runs if r.ref not in mine and not r.parent_ref][:limit]
        originals = [tapes.rebuild(r) for r in chosen]
        trees = {}
        from .rebuild import reconstruct_tree

        for run in originals:
            trees[run.ref] = reconstruct_tree(tapes.reader, run.ref).root
    result = ExperimentResult(name, selected=len(originals))
    client = candidate.make_client()
    own = tape is None
    if own:
        tape = otel_agenttape.setup(endpoint=endpoint or default_endpoint(source), protocol="http/protobuf",
                                    service_name=EXPERIMENT_SERVICE, seal=seal)
    book = Journal(journal or default_journal(name), durability="process")
    done = {e.request_hash: e for e in book.load(name)}
    settings = {**candidate.settings(), "tools": tools}
    try:
        for original in originals:
            h = request_hash({"program": original.ref, "candidate": settings})
            entry = done.get(h)
            if entry is not None and entry.state == COMMITTED:
                result.skipped += 1
                result.runs.append({"of": original.ref, "run_id": (entry.result or {}).get("run_id"), "skipped": True})
                continue
            attempt = int((entry.extra or {}).get("attempt", 0)) + 1 if entry is not None else 1
            run_id = f"exp-{h[:16]}-{attempt}"
            tree = trees[original.ref]
            executor = TapeTools(tree_nodes(tree), tools, dict(live or {}), mock)
            messages = [d for m in original.input for d in m.to_openai()]
            text = next((m.text for m in reversed(original.input) if m.role == "user"), "")
            attributes = {EXPERIMENT_NAME: name, EXPERIMENT_OF: original.ref, EXPERIMENT_NODE: "",
                          EXPERIMENT_MODEL: candidate.model, EXPERIMENT_KIND: "program"}
            error = None
            try:
                with tape.run(agent=original.agent, run_id=run_id, input=text or messages, model=candidate.model,
                              attributes=attributes) as run:
                    output = fn(ProgramContext(original, text, messages, candidate.model, client, executor, tape, run))
                    if output is not None and run.output is None:
                        run.set_output(output if isinstance(output, str) else str(output))
            except Exception as exc:  # the run records it; the experiment goes on
                error = _error_text(exc)
            book.put(Entry(tape=name, kind=JOURNAL_KIND, request_hash=h, occurrence=0, position=0,
                           request={"of": original.ref}, name=original.ref, state=FAILED if error else COMMITTED,
                           result={"run_id": run_id}, error={"message": error} if error else None,
                           extra={"attempt": attempt}), sync=False)
            result.failed += bool(error)
            result.answered += not error
            result.runs.append({"of": original.ref, "run_id": run_id, "error": error, "tools_served": executor.served,
                                "tools_live": executor.live_calls, "tools_mocked": executor.mocked,
                                "diverged": [{"name": n, "arguments": a} for n, a in executor.diverged]})
    finally:
        book.close()
        if own:
            tape.force_flush()
            tape.shutdown()
    return result
