"""A run's ordered steps as plain dicts, in the kinds of the ``steps`` view.

input, text, reasoning, tool_call, tool_result, metadata, terminal: one stream a reader (or the
console) renders in order. Built from the rebuilt run, so it holds for every source.
"""

from __future__ import annotations

from typing import Any

from ..model import Run

_KINDS = {"tool-start": "tool_call", "tool-call": "tool_call", "tool-result": "tool_result", "retry": "metadata"}


def step_dicts(run: Run) -> list[dict[str, Any]]:
    nodes = {n.span_id: n for n in run.nodes}
    out: list[dict[str, Any]] = []
    executed = {t.call_id for t in run.tools if t.executed and t.call_id}
    for step in run.steps:
        p = step.payload
        if step.kind in ("model-start", "model-end"):
            continue
        if step.kind == "tool-call" and p.get("id") in executed:
            continue  # the tool span that ran it carries the call
        node = nodes.get(step.span_id or "")
        item: dict[str, Any] = {
            "index": len(out), "kind": _KINDS.get(step.kind, step.kind), "time_ns": step.time_ns,
            "span_id": step.span_id, "node": node.node_id or node.name if node else None,
            "node_type": node.node_type if node else ("run" if step.kind in ("input", "terminal") else None),
            "name": None, "content": None, "status": None,
        }
        if step.kind == "input":
            item["content"] = p.get("messages")
            if run.input_from:
                item["input_from"] = run.input_from  # its own spans carry none: read from a model call
        elif step.kind in ("text", "reasoning"):
            item["content"] = p.get("text")
            item["name"] = node.model if node else None
        elif step.kind == "metadata":
            item["content"] = p.get("data")
        elif step.kind == "retry":
            item["name"], item["content"] = "retry", p.get("reason")
        elif step.kind in ("tool-start", "tool-call"):
            item["name"], item["content"] = p.get("name"), p.get("arguments")
            item["call_id"] = p.get("id")
            if step.kind == "tool-call":
                item["status"] = "not_run"  # the model asked for it; no tool span recorded it running
        elif step.kind == "tool-result":
            item["name"], item["call_id"] = p.get("name"), p.get("id")
            item["content"] = p.get("error") if p.get("error") else p.get("result")
            item["status"] = "error" if p.get("error") else "ok"
        elif step.kind == "terminal":
            item["name"], item["status"], item["content"] = run.agent, p.get("status"), p.get("message")
            item["output"] = run.output
            if run.output_from:
                item["output_from"] = run.output_from
        out.append(item)
    return out
