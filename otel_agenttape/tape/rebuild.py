"""Rebuild runs and run trees from stored spans, with no model call.

A run is identified by its key and its trace (the ref ``KEY@TRACE_ID``): an ``agenttape.run.id``; the
span id of another instrumentation's run span; or, for a trace with no run span, the trace id. The
``runs`` view (store/runs_view.py) lists the same runs by the same rules. Within a trace, spans belong
to the nearest enclosing run span; child runs in other traces are found by ``agenttape.parent_run.id``
or by span links.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import semconv as sc
from ..codec.messages_read import Message
from . import foreign
from .load import (
    Reader,
    SpanRow,
    TraceSet,
    Windows,
    child_traces,
    load_logs,
    load_traces,
)
from .model import Node, Run, RunTree, Usage
from .refs import AmbiguousRunError, Resolved, RunNotFound, resolve, split_ref
from .stream import build_steps, tool_calls

MAX_TREE_DEPTH = 64
STATUS_INCOMPLETE = "incomplete"
MODEL_CALL = "model_call"  # a run's input_from / output_from: read from model calls, not its own spans
Key = tuple[str, str]  # (run key, trace id)

__all__ = ["AmbiguousRunError", "RunNotFound", "build_steps", "reconstruct", "reconstruct_tree"]


@dataclass
class _RunParts:
    key: str
    trace_id: str
    run_spans: list[SpanRow] = field(default_factory=list)
    node_spans: list[SpanRow] = field(default_factory=list)
    all_spans: list[SpanRow] = field(default_factory=list)
    implicit_root: SpanRow | None = None
    parent_key: Key | None = None  # enclosing run within the same trace


class _Index:
    """Runs of a set of traces, with the spans each one owns."""

    def __init__(self, ts: TraceSet) -> None:
        self.ts = ts
        self.runs: dict[Key, _RunParts] = {}
        self.owner: dict[tuple[str, str], Key] = {}
        by_trace: dict[str, dict[str, SpanRow]] = {}
        for span in ts.spans.values():
            by_trace.setdefault(span.trace_id, {})[span.span_id] = span
        for trace_id in sorted(by_trace):
            self._partition(trace_id, by_trace[trace_id])

    def _partition(self, trace_id: str, spans: dict[str, SpanRow]) -> None:
        for s in spans.values():
            root = not s.parent_span_id or s.parent_span_id not in spans
            if root != s.is_root:
                s.is_root, s.role = root, None  # a CHAIN/workflow is a run only at the root
        kinds = {sid: foreign.classify(s) for sid, s in spans.items()}
        memo: dict[str, str | None] = {}

        def nearest_run(sid: str, include_self: bool) -> str | None:
            """Span id of the nearest run span at or above ``sid``."""
            if include_self and kinds.get(sid) == foreign.RUN:
                return sid
            if sid in memo:
                return memo[sid]
            seen = {sid}
            cur = spans[sid].parent_span_id
            found = None
            while cur and cur in spans and cur not in seen:
                if kinds[cur] == foreign.RUN:
                    found = cur
                    break
                seen.add(cur)
                cur = spans[cur].parent_span_id
            memo[sid] = found
            return found

        run_key: dict[str, Key] = {}
        ordered = sorted(spans.values(), key=lambda s: (s.start_ns, s.span_id))
        for s in ordered:
            if kinds[s.span_id] != foreign.RUN:
                continue
            rid = s.run_id or s.attrs.get(sc.RUN_ID)
            run_key[s.span_id] = (str(rid) if rid else s.span_id, trace_id)
        roots = [s for s in ordered if not s.parent_span_id or s.parent_span_id not in spans]
        for s in ordered:
            rsid = nearest_run(s.span_id, include_self=True)
            if rsid is not None:
                key = run_key[rsid]
            elif s.run_id:
                key = (s.run_id, trace_id)
            else:
                key = (trace_id, trace_id)
            parts = self.runs.get(key)
            if parts is None:
                parts = self.runs[key] = _RunParts(key=key[0], trace_id=trace_id)
                if key[0] == trace_id and rsid is None:
                    parts.implicit_root = roots[0] if roots else s
            self.owner[s.key] = key
            parts.all_spans.append(s)
            if rsid == s.span_id:
                parts.run_spans.append(s)
                parent = nearest_run(s.span_id, include_self=False)
                if parent is not None and run_key[parent] != key:
                    parts.parent_key = run_key[parent]
                elif parent is None and s.parent_span_id in spans:
                    owner = self.owner.get((trace_id, s.parent_span_id))
                    if owner is not None and owner != key:
                        parts.parent_key = owner
            elif kinds[s.span_id] in (foreign.MODEL, foreign.TOOL):
                parts.node_spans.append(s)
        self._handoffs(trace_id, spans, ordered, run_key, nearest_run)

    def _handoffs(self, trace_id: str, spans: dict[str, SpanRow], ordered: list[SpanRow],
                  run_key: dict[str, Key], nearest_run: Any) -> None:
        """An agent handed over to is a child run of the agent that handed over, as our processor records
        it, though other instrumentations start it beside that agent (under the workflow span): found
        by a handoff span naming the agent (``gen_ai.handoff.to_agent``), or by OpenInference's
        ``graph.node.parent_id``. The ``runs`` view (store/runs_view.py) applies the same rule."""
        runs = [s for s in ordered if s.span_id in run_key]
        if len(runs) < 2:
            return
        marks: list[tuple[int, str, Key]] = []  # (start, agent handed to, run that handed over)
        for s in ordered:
            to = s.attrs.get(sc.GEN_AI_HANDOFF_TO)
            owner = nearest_run(s.span_id, include_self=False) if isinstance(to, str) else None
            if owner is not None:
                marks.append((s.start_ns, to, run_key[owner]))
        for x in runs:
            if x.run_id or x.attrs.get(sc.RUN_ID):
                continue  # ours: the processor records the handoff as the child run's parent run id
            agent = _agent_of(x)
            key = run_key[x.span_id]
            parts = self.runs[key]
            parent: Key | None = None
            by = x.attrs.get(sc.OI_GRAPH_NODE_PARENT_ID)
            if isinstance(by, str) and by != agent:
                before = [r for r in runs if r.start_ns <= x.start_ns and r is not x and _agent_of(r) == by]
                parent = run_key[before[-1].span_id] if before else None
            elif agent:
                before = [m for m in marks if m[1] == agent and m[0] <= x.start_ns and m[2] != key]
                parent = before[-1][2] if before else None
            if parent is None or parent == parts.parent_key or self._encloses(key, parent):
                continue
            parts.parent_key = parent

    def _encloses(self, key: Key, other: Key) -> bool:
        """Whether ``key`` is ``other`` or one of its parent runs (a new edge must not make a cycle)."""
        seen: set[Key] = set()
        cur: Key | None = other
        while cur is not None and cur not in seen:
            if cur == key:
                return True
            seen.add(cur)
            cur = self.runs[cur].parent_key if cur in self.runs else None
        return False

    def root_of(self, trace_id: str) -> Key | None:
        """The run a trace id names: its first top-level run span, else the trace's own run."""
        tops = [p for k, p in self.runs.items() if k[1] == trace_id and p.run_spans and p.parent_key is None]
        if tops:
            first = min(tops, key=lambda p: (min(s.start_ns for s in p.run_spans), p.key))
            return (first.key, trace_id)
        if (trace_id, trace_id) in self.runs:
            return (trace_id, trace_id)
        rest = [k for k in self.runs if k[1] == trace_id]
        return min(rest, key=lambda k: min(s.start_ns for s in self.runs[k].all_spans)) if rest else None

    def find(self, target: Resolved) -> Key:
        key = (target.key, target.trace_id) if target.key is not None else self.root_of(target.trace_id)
        if key is None or key not in self.runs:
            raise RunNotFound(target.ref if target.key else target.trace_id)
        return key

    def child_keys(self, key: Key) -> list[Key]:
        """Runs started by this one: nested in its spans, naming it as parent run, or linking to it."""
        my_spans = {s.key for s in self.runs[key].all_spans}
        out: list[Key] = []
        for other_key, other in self.runs.items():
            if other_key == key:
                continue
            if other.parent_key == key:
                out.append(other_key)
                continue
            enclosing = self.runs.get(other.parent_key) if other.parent_key else None
            if not other.run_spans:  # its run span never arrived (the process died): its nodes name the parent
                if enclosing is None and any(s.attrs.get(sc.PARENT_RUN_ID) == key[0] for s in other.node_spans):
                    out.append(other_key)
                continue
            if enclosing is not None and enclosing.run_spans:
                continue  # nested in another run span: that run is its parent
            first = other.run_spans[0]
            if (first.parent_run_id or first.attrs.get(sc.PARENT_RUN_ID)) == key[0]:
                out.append(other_key)
            elif first.attrs.get(sc.PREVIOUS_RUN_ID):
                continue  # a later turn of a session links to the run it follows: not a child
            elif any(link in my_spans for span in other.run_spans for link in span.links):
                out.append(other_key)
        return out


    def models_below(self, key: Key) -> list[Node]:
        """The model calls of every run this one started that the index holds, in start order."""
        seen, todo, spans = {key}, [key], []
        while todo:
            for kid in self.child_keys(todo.pop()):
                if kid not in seen:
                    seen.add(kid)
                    todo.append(kid)
                    spans += [s for s in self.runs[kid].node_spans if foreign.classify(s) == foreign.MODEL]
        nodes = [foreign.model_node(s) for s in sorted(spans, key=lambda s: (s.start_ns, s.span_id))]
        return nodes

    def build(self, key: Key) -> Run:
        """The run ``key`` names, its input and output read from the runs below it where it has none."""
        return build_run(self.runs[key], lambda: self.models_below(key))


def _agent_of(span: SpanRow) -> str | None:
    name = span.agent_name or span.attrs.get(sc.GEN_AI_AGENT_NAME) or span.attrs.get(sc.OI_AGENT_NAME)
    return str(name) if name else None


def reconstruct(reader: Reader, ref: str) -> Run:
    """Rebuild one run (prompt, output, tool calls, usage, status, steps) from the store.

    ``ref`` is ``RUN_ID@TRACE_ID``, a trace id (its root run) or a bare run id naming one run."""
    target = resolve(reader, ref)
    index = _Index(_load(reader, target.windows, links=False))
    return index.build(index.find(target))


def _load(reader: Reader, windows: Windows, ts: TraceSet | None = None, *, links: bool = True) -> TraceSet:
    """Spans and events of these traces; log records only when a model span needs its content from them."""
    before = set(ts.trace_ids) if ts is not None else set()
    ts = load_traces(reader, windows, into=ts, links=links, logs=False)
    new = set(ts.trace_ids - before)
    if new and any(foreign.lacks_content(s) for s in ts.spans.values() if s.trace_id in new):
        load_logs(reader, sorted(new), ts)
    return ts


def reconstruct_tree(reader: Reader, ref: str) -> RunTree:
    """Rebuild a run and every run it started, in this trace or others, ordered by start."""
    target = resolve(reader, ref)
    traces = target.windows
    ts = _load(reader, traces)
    asked_runs: set[str] = set()
    asked_traces: set[str] = set()
    since = min(lo for lo, _ in (w for w in traces.values() if w is not None)) if traces else None
    for _ in range(MAX_TREE_DEPTH):
        index = _Index(ts)
        run_ids = sorted({k[0] for k in index.runs} - asked_runs)
        trace_ids = sorted(ts.trace_ids - asked_traces)
        asked_runs.update(run_ids)
        asked_traces.update(trace_ids)
        found = child_traces(reader, run_ids, trace_ids, since)
        new = {t: w for t, w in found.items() if t not in ts.trace_ids}
        if not new:
            break
        _load(reader, new, ts)
    index = _Index(ts)
    root_key = index.find(target)
    built: dict[Key, Run] = {}

    def build(key: Key, depth: int, seen: set[Key]) -> Run:
        run = built.get(key) or index.build(key)
        built[key] = run
        if depth < MAX_TREE_DEPTH:
            kids = [k for k in index.child_keys(key) if k not in seen]
            run.children = sorted(
                (build(k, depth + 1, seen | {k}) for k in kids), key=lambda r: (r.start_ns, r.run_id)
            )
        return run

    return RunTree(root=build(root_key, 0, {root_key}))


# --- building one run ---------------------------------------------------------------------------


def _from_nodes(parts: _RunParts, key: str, run_spans: Sequence[Any]) -> Any:
    """An attribute of the run read from its node spans, for a run whose run span never arrived."""
    if run_spans:
        return None
    return next((s.attrs[key] for s in parts.node_spans if s.attrs.get(key)), None)


def _dedupe_nested_models(parts: _RunParts, nodes: list[Node]) -> list[Node]:
    """A model span inside another model span (an SDK instrumentation under ours) is one call."""
    by_id = {s.span_id: s for s in parts.all_spans}
    model_ids = {n.span_id for n in nodes if n.node_type == "model"}
    tool_ids = {n.span_id for n in nodes if n.node_type == "tool"}
    out = []
    for n in nodes:
        cur = by_id.get(n.parent_span_id or "")
        nested = False
        same = model_ids if n.node_type == "model" else tool_ids
        while cur is not None:
            if cur.span_id in same:
                nested = True
                break
            cur = by_id.get(cur.parent_span_id or "")
        if not nested:
            out.append(n)
    return out


def _status(run_spans: list[SpanRow], root: SpanRow | None, nodes: list[Node]) -> tuple[str, str | None]:
    spans = run_spans or ([root] if root else [])
    for s in reversed(spans):
        explicit = s.attrs.get(sc.RUN_STATUS)
        if explicit:
            return str(explicit), s.status_message
    for s in reversed(spans):
        if s.status_code == 2:
            return sc.STATUS_ERROR, s.status_message
    if not spans:
        # nodes of a run whose run span never arrived: still running, or its process died
        return STATUS_INCOMPLETE, "no run span recorded (still running, or the process ended early)"
    return sc.STATUS_COMPLETED, None


def _run_io(inputs: list[Message], outputs: list[Message], models: list[Node],
            below: Callable[[], list[Node]] | None) -> tuple[list[Message], str | None, str, str | None]:
    """The run's input and output, and where each came from when its own spans carry none (``model_call``).

    A run span's own content comes first. Without it a run with model calls of its own takes the first
    call's prompt and the last call's answer; a run with none (a workflow whose agents are child runs, as
    the Agents SDK and LangGraph instrumentations record them) takes the last user message of the first
    model call below it and the answer of the last one (``below`` lists those calls, in start order)."""
    input_from = output_from = None
    if models and not inputs:
        inputs, input_from = models[0].prompt, MODEL_CALL
    elif models and not any(m.role == "system" for m in inputs) and models[0].system_instructions:
        inputs = list(models[0].system_instructions) + inputs
    if outputs:
        return inputs, input_from, "".join(m.text for m in outputs), None
    if models:
        output = models[-1].output_text
        return inputs, input_from, output, MODEL_CALL if output else None
    calls = below() if below is not None else []
    if not inputs and calls:
        users = [m for m in calls[0].prompt if m.role == "user"]
        if users:
            inputs, input_from = users[-1:], MODEL_CALL
    last = max(calls, key=lambda n: (n.end_ns, n.start_ns), default=None)
    output = last.output_text if last is not None else ""
    return inputs, input_from, output, MODEL_CALL if output else None


def build_run(parts: _RunParts, below: Callable[[], list[Node]] | None = None) -> Run:
    """One run from the spans it owns; ``below`` lists the model calls of the runs it started, which give
    its input and output when neither its own spans nor model calls of its own do."""
    run_spans = sorted(parts.run_spans, key=lambda s: s.start_ns)
    root = run_spans[0] if run_spans else parts.implicit_root
    nodes = [n for n in (foreign.node_of(s) for s in parts.node_spans) if n is not None]
    nodes = _dedupe_nested_models(parts, nodes)
    nodes.sort(key=lambda n: (n.start_ns, n.step if n.step is not None else -1, n.span_id))
    spans = parts.all_spans
    start = min((s.start_ns for s in spans), default=0)
    end = max((s.end_ns for s in spans), default=0)
    if run_spans:
        start = min(s.start_ns for s in run_spans)
        end = max(s.end_ns for s in run_spans)

    inputs: list[Message] = []
    outputs: list[Message] = []
    agent = None
    for s in run_spans or ([root] if root else []):
        i, o, a = foreign.run_content(s)
        inputs = inputs or i
        outputs = o or outputs
        agent = agent or a
    models = [n for n in nodes if n.node_type == "model"]
    inputs, input_from, output, output_from = _run_io(inputs, outputs, models, below)
    source = foreign.source(run_spans[0]) if run_spans else (
        foreign.source(min(parts.node_spans, key=lambda s: (s.start_ns, s.span_id))) if parts.node_spans
        else sc.SOURCE_AGENTTAPE)
    if agent is None and run_spans and source != sc.SOURCE_AGENTTAPE:
        agent = run_spans[0].name  # another instrumentation's run span without an agent name: its span name
    if agent is None:
        for s in spans:
            if s in run_spans:
                continue
            agent = s.attrs.get(sc.GEN_AI_AGENT_NAME) or s.attrs.get(foreign.OI_AGENT_NAME)
            if agent:
                break
    if agent is None and root is not None and not run_spans:
        agent = root.service_name or root.name
    session = next((x for x in (foreign.session_of(s) for s in run_spans[:1]) if x), None) or next(
        (x for x in (foreign.session_of(s) for s in sorted(spans, key=lambda s: (s.start_ns, s.span_id))) if x),
        None)

    status, message = _status(run_spans, root, nodes)
    usage = Usage()
    for n in models:
        usage.add(n.usage)
    if not models and root is not None:
        usage = foreign.usage_of(root.attrs)

    first = root
    attrs = first.attrs if first is not None else {}
    tool_defs: dict[str, dict] = {}
    for n in models:
        for d in n.tool_definitions:
            tool_defs.setdefault(d["name"], d)
    truncated = sorted({f"{n.span_id}:{k}" for n in nodes for k in n.truncated})
    for s in run_spans:
        truncated += [f"{s.span_id}:{k}" for k in foreign.truncated_keys(s)]
    erased = sorted({f"{s.span_id}:{k}" for s in run_spans for k in s.erased}
                    | {f"{n.span_id}:{k}" for n in nodes for k in n.erased})
    run = Run(
        run_id=parts.key,
        trace_id=parts.trace_id,
        span_id=first.span_id if first is not None else None,
        agent=agent,
        status=status,
        status_message=message,
        start_ns=start,
        end_ns=end,
        session_id=session,
        parent_run_id=((first.parent_run_id or attrs.get(sc.PARENT_RUN_ID)) if first is not None else None)
        or _from_nodes(parts, sc.PARENT_RUN_ID, run_spans) or (parts.parent_key[0] if parts.parent_key else None),
        source=source,
        previous_run_id=attrs.get(sc.PREVIOUS_RUN_ID),
        service_name=first.service_name if first is not None else None,
        convention=foreign.convention(first) if first is not None else "genai",
        input=inputs,
        input_from=input_from,
        output=output,
        output_from=output_from,
        output_messages=outputs,
        tools=tool_calls(nodes),
        tool_definitions=list(tool_defs.values()),
        usage=usage,
        models=list(dict.fromkeys(n.model for n in models if n.model)),
        nodes=nodes,
        truncated=truncated,
        erased=erased,
        trace_ids=sorted({s.trace_id for s in spans}),
    )
    run.steps = build_steps(run)
    return run


# --- many runs ---------------------------------------------------------------------------------


def run_span_keys(reader: Reader, ref: str) -> list[tuple[str, str]]:
    """(trace id, span id) of the spans one run owns (its run spans, nodes and the spans between)."""
    target = resolve(reader, ref)
    index = _Index(_load(reader, target.windows, links=False))
    parts = index.runs[index.find(target)]
    return sorted({s.key for s in parts.all_spans})


def iter_runs(reader: Reader, refs: Sequence[str], batch_traces: int = 200, *,
              children: bool = False) -> Iterator[Run]:
    """Rebuild many runs (``RUN_ID@TRACE_ID`` refs, as ``runs`` lists them), loading traces in batches.
    ``children``: each run's ``children`` holds the runs below it in its own trace (a whole program's
    runs, without the queries ``reconstruct_tree`` spends on runs continued in other traces)."""
    from .load import trace_windows

    wanted = [split_ref(r) for r in refs]
    for lo in range(0, len(wanted), batch_traces):
        batch = wanted[lo: lo + batch_traces]
        traces = sorted({t for _, t in batch if t})
        index = _Index(_load(reader, trace_windows(reader, traces), links=False))
        if not children:
            for key, trace in batch:
                if (key, trace or key) in index.runs:
                    yield index.build((key, trace or key))
            continue
        built = {k: index.build(k) for k in index.runs}
        below: dict[Key, list[Run]] = {}
        for k, run in sorted(built.items(), key=lambda kv: kv[1].start_ns):
            if run.parent_run_id and (run.parent_run_id, k[1]) in built:
                below.setdefault((run.parent_run_id, k[1]), []).append(run)
        for run in built.values():
            run.children = list(below.get((run.run_id, run.trace_id), []))
        for key, trace in batch:
            if (key, trace or key) in built:
                yield built[(key, trace or key)]


@dataclass
class Answer:
    """One model call read on its own (``iter_answers``): the node, and the status of the run it is in."""

    node: Node | None
    run_found: bool
    status: str
    status_message: str | None


def iter_answers(reader: Reader, wanted: Sequence[tuple[str, str | None]], *, prompt: bool = True,
                 batch_traces: int = 200) -> Iterator[tuple[tuple[str, str | None], Answer]]:
    """The model calls of many runs without rebuilding the runs: for each (``RUN_ID@TRACE_ID``, span id)
    the model span of that id in the run's trace, or with no span id the run's first model call, and the
    run's status. What a node-level comparison needs of thousands of runs (no steps, no tool nodes, no run
    content; ``prompt=False``: no prompts either)."""
    from .load import trace_windows

    keyed = [(w, split_ref(w[0])) for w in wanted]
    for lo in range(0, len(keyed), batch_traces):
        batch = keyed[lo: lo + batch_traces]
        ts = _load(reader, trace_windows(reader, sorted({t for _, (_, t) in batch if t})), links=False)
        by_trace: dict[str, list[SpanRow]] = {}
        for span in ts.spans.values():
            by_trace.setdefault(span.trace_id, []).append(span)
        for want, (run_id, trace) in batch:
            spans = by_trace.get(trace or run_id, [])
            mine = [s for s in spans if (s.run_id or s.attrs.get(sc.RUN_ID)) == run_id]
            run_spans = sorted((s for s in mine if foreign.classify(s) == foreign.RUN), key=lambda s: s.start_ns)
            if want[1]:
                chosen = next((s for s in spans if s.span_id == want[1] and foreign.classify(s) == foreign.MODEL), None)
            else:
                chosen = min((s for s in mine if foreign.classify(s) == foreign.MODEL),
                             key=lambda s: (s.start_ns, s.span_id), default=None)
            node = foreign.model_node(chosen, prompt=prompt) if chosen is not None else None
            status, message = _status(run_spans, None, [])
            yield want, Answer(node, bool(mine), status, message)
