"""A stand-in for the read model's ``Tapes`` over today's rebuild functions (replaced by ``otel_agenttape.open``).

Every method answers in the shape the read model documents, so the console's API and page do not
change when the read model replaces this module.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from otel_agenttape.tape.diff import diff_runs
from otel_agenttape.tape.model import Run
from otel_agenttape.tape.rebuild import RunNotFound, iter_runs, list_runs, reconstruct, reconstruct_tree


class AmbiguousRunError(LookupError):
    """A bare run id names runs in several traces."""


@dataclass
class RunSummary:
    ref: str
    run_id: str
    trace_id: str
    span_id: str | None
    agent: str | None
    status: str
    source: str
    session_id: str | None
    service: str | None
    parent_ref: str | None
    start_ns: int
    end_ns: int
    duration_ms: float
    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    errors: int = 0
    tape_id: str | None = None
    models: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    incomplete: bool = False
    status_message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_run(cls, run: Run, parent_ref: str | None = None) -> RunSummary:
        tools = run.tool_nodes
        return cls(
            ref=f"{run.run_id}@{run.trace_id}", run_id=run.run_id, trace_id=run.trace_id, span_id=run.span_id,
            agent=run.agent, status=run.status, source=run.convention, session_id=run.session_id,
            service=run.service_name, parent_ref=parent_ref, start_ns=run.start_ns, end_ns=run.end_ns,
            duration_ms=run.duration_ms, model_calls=len(run.model_nodes), tool_calls=len(tools),
            input_tokens=run.usage.input_tokens, output_tokens=run.usage.output_tokens,
            errors=sum(1 for n in run.nodes if n.status == "error"),
            tape_id=next((str(n.attributes["agenttape.chain.id"]) for n in run.nodes
                          if n.attributes.get("agenttape.chain.id")), None),
            models=sorted(set(run.models)), tools=sorted({n.tool_name for n in tools if n.tool_name}),
            incomplete=run.status == "incomplete", status_message=run.status_message,
        )


@dataclass
class Page:
    runs: list[RunSummary]
    total: int
    next_cursor: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [r.to_dict() for r in self.runs], "total": self.total, "next_cursor": self.next_cursor}


def _run_id(ref: str) -> str:
    return ref.partition("@")[0]


def _text_of(run: Run) -> str:
    return json.dumps(run.to_json(children=False), default=str) + json.dumps(
        [n.summary() for n in run.nodes], default=str)


class InterimTapes:
    """Runs, steps, trees, sessions, diffs, verification over one reader (rebuilding every run per listing)."""

    def __init__(self, reader: Any, closer: Any = None) -> None:
        self.reader = reader
        self._closer = closer
        self.description = str(getattr(reader, "description", "") or "")

    def close(self) -> None:
        self.reader.close()
        if self._closer:
            self._closer()

    def _all(self) -> list[Run]:
        return list(iter_runs(self.reader, list_runs(self.reader)))

    def runs(self, agent: str | None = None, status: str | None = None, source: str | None = None,
             session: str | None = None, service: str | None = None, model: str | None = None,
             tool: str | None = None, since: Any = None, until: Any = None, text: str | None = None,
             parent: str | None = None, limit: int = 50, cursor: str | None = None) -> Page:
        from otel_agenttape.tape.dataset import parse_since

        lo = parse_since(str(since)) if since not in (None, "") else None
        hi = parse_since(str(until)) if until not in (None, "") else None
        rows = []
        for run in self._all():
            s = RunSummary.from_run(run, None)
            if run.parent_run_id:
                s.parent_ref = f"{run.parent_run_id}@{run.trace_id}"
            checks = [(agent, s.agent), (status, s.status), (source, s.source), (session, s.session_id),
                      (service, s.service)]
            if any(want is not None and want != have for want, have in checks):
                continue
            if model is not None and model not in s.models or tool is not None and tool not in s.tools:
                continue
            if lo is not None and s.start_ns < lo or hi is not None and s.start_ns >= hi:
                continue
            if parent is not None and parent not in (s.parent_ref, run.parent_run_id):
                continue
            if text and text.lower() not in _text_of(run).lower():
                continue
            rows.append(s)
        rows.sort(key=lambda r: (r.start_ns, r.ref), reverse=True)
        offset = int(base64.urlsafe_b64decode(cursor + "==").decode()) if cursor else 0
        chunk = rows[offset:offset + limit]
        more = offset + limit < len(rows)
        nxt = base64.urlsafe_b64encode(str(offset + limit).encode()).decode().rstrip("=") if more else None
        return Page(runs=chunk, total=len(rows), next_cursor=nxt)

    def rebuild(self, ref: str) -> Run:
        return reconstruct(self.reader, _run_id(ref))

    def run(self, ref: str) -> RunSummary:
        run = self.rebuild(ref)
        s = RunSummary.from_run(run)
        if run.parent_run_id:
            s.parent_ref = f"{run.parent_run_id}@{run.trace_id}"
        return s

    def steps(self, ref: str) -> list[dict[str, Any]]:
        run = self.rebuild(ref)
        kinds = {"tool-start": "tool_call", "tool-call": "tool_call", "tool-result": "tool_result",
                 "retry": "metadata"}
        nodes = {n.span_id: n for n in run.nodes}
        executed = {t.call_id for t in run.tools if t.executed and t.call_id}
        out: list[dict[str, Any]] = []
        for step in run.steps:
            p = step.payload
            if step.kind in ("model-start", "model-end") or (step.kind == "tool-call" and p.get("id") in executed):
                continue
            node = nodes.get(step.span_id or "")
            item: dict[str, Any] = {
                "index": len(out), "kind": kinds.get(step.kind, step.kind), "time_ns": step.time_ns,
                "span_id": step.span_id, "node": (node.node_id or node.name) if node else None,
                "node_type": node.node_type if node else ("run" if step.kind in ("input", "terminal") else None),
                "name": None, "content": None, "status": None,
            }
            if step.kind == "input":
                item["content"] = p.get("messages")
            elif step.kind in ("text", "reasoning"):
                item["content"], item["name"] = p.get("text"), node.model if node else None
            elif step.kind == "metadata":
                item["content"] = p.get("data")
            elif step.kind == "retry":
                item["name"], item["content"] = "retry", p.get("reason")
            elif step.kind in ("tool-start", "tool-call"):
                item["name"], item["content"], item["call_id"] = p.get("name"), p.get("arguments"), p.get("id")
                if step.kind == "tool-call":
                    item["status"] = "not_run"
            elif step.kind == "tool-result":
                item["name"], item["call_id"] = p.get("name"), p.get("id")
                item["content"] = p.get("error") or p.get("result")
                item["status"] = "error" if p.get("error") else "ok"
            elif step.kind == "terminal":
                item["name"], item["status"], item["content"] = run.agent, p.get("status"), p.get("message")
            out.append(item)
        return out

    def replay(self, ref: str, tree: bool = False) -> dict[str, Any]:
        if tree:
            return reconstruct_tree(self.reader, _run_id(ref)).root.to_json(children=True)
        return self.rebuild(ref).to_json(children=False)

    def tree(self, ref: str) -> dict[str, Any]:
        root = reconstruct_tree(self.reader, _run_id(ref)).root

        def node(run: Run, parent: str | None) -> dict[str, Any]:
            out = RunSummary.from_run(run, parent).to_dict()
            out["children"] = [node(c, out["ref"]) for c in run.children]
            return out

        return node(root, None)

    def session(self, session_id: str) -> list[RunSummary]:
        page = self.runs(session=session_id, limit=10_000)
        return sorted(page.runs, key=lambda r: (r.start_ns, r.ref))

    def diff(self, ref_a: str, ref_b: str) -> dict[str, Any]:
        a, b = self.rebuild(ref_a), self.rebuild(ref_b)
        d = diff_runs(a, b)
        return {"run_a": a.run_id, "run_b": b.run_id, "ref_a": f"{a.run_id}@{a.trace_id}",
                "ref_b": f"{b.run_id}@{b.trace_id}", "diverged": d is not None,
                "first_divergence": d.to_json() if d else None}

    def verify(self, tape_id: str | None = None) -> list[dict[str, Any]]:
        from otel_agenttape.tape.verification import verify_store

        return [r.to_json() for r in verify_store(self.reader, run=tape_id)]

    def spans_otlp(self, ref: str) -> dict[str, Any]:
        raise NotImplementedError("spans as OTLP JSON come with the read model")


def open_interim(reader: Any, closer: Any = None) -> InterimTapes:
    return InterimTapes(reader, closer)


__all__ = ["AmbiguousRunError", "InterimTapes", "Page", "RunNotFound", "RunSummary", "open_interim"]
