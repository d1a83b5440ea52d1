"""A rebuilt run's tool calls (requested and executed, paired) and its ordered step stream."""

from __future__ import annotations

from .. import semconv as sc
from .model import Node, Run, Step, ToolCall


def tool_calls(nodes: list[Node]) -> list[ToolCall]:
    """Executed tools (tool spans) plus calls the model asked for that have no tool span."""
    calls: list[ToolCall] = []
    by_id: dict[str, ToolCall] = {}
    responses: dict[str, object] = {}
    for n in nodes:
        if n.node_type == "model":
            for m in n.input_messages:
                for r in m.tool_responses:
                    if r.get("id"):
                        responses[str(r["id"])] = r.get("response")
    for n in nodes:
        if n.node_type == "model":
            for c in n.requested_tool_calls:
                cid = c.get("id")
                call = ToolCall(name=c.get("name"), arguments=c.get("arguments"), call_id=cid)
                if cid and str(cid) in responses:
                    call.result = responses[str(cid)]
                    call.answered = True
                calls.append(call)
                if cid:
                    by_id[str(cid)] = call
        elif n.node_type == "tool":
            call = by_id.get(str(n.tool_call_id)) if n.tool_call_id else None
            if call is None:
                # a tool span without a call id answers the oldest open request of that tool
                call = next((c for c in calls if not c.executed and c.name == n.tool_name), None)
            if call is None:
                call = ToolCall(name=n.tool_name, call_id=n.tool_call_id)
                calls.append(call)
            call.name = n.tool_name or call.name
            if n.arguments is not None:
                call.arguments = n.arguments
            call.result = n.result if n.result is not None else call.result
            call.error = n.tool_error
            call.span_id = n.span_id
            call.executed = True
    return calls


def build_steps(run: Run) -> list[Step]:
    """The ordered step stream: input, model and tool steps with their segments, terminal."""
    steps: list[Step] = []

    def add(kind: str, time_ns: int, span_id: str | None, **payload: object) -> None:
        steps.append(Step(len(steps), kind, time_ns, span_id, payload))

    add("input", run.start_ns, run.span_id, messages=[m.to_json() for m in run.input])
    for n in run.nodes:
        if n.node_type == "model":
            add("model-start", n.start_ns, n.span_id, model=n.model, node_id=n.node_id, step=n.step)
            had_text = False
            for e in n.events:
                name = e.get("name")
                if name == sc.EVENT_TEXT:
                    had_text = True
                    add("text", e["time_ns"], n.span_id, text=e.get(sc.EVENT_SEGMENT, e.get("text", "")))
                elif name == sc.EVENT_REASONING:
                    add("reasoning", e["time_ns"], n.span_id, text=e.get(sc.EVENT_SEGMENT, ""))
                elif name == sc.EVENT_RETRY:
                    add("retry", e["time_ns"], n.span_id, reason=e.get(sc.EVENT_REASON))
                elif name == sc.EVENT_METADATA:
                    add("metadata", e["time_ns"], n.span_id,
                        data={k: v for k, v in e.items() if k not in ("name", "time_ns")})
            if not had_text and n.output_text:
                add("text", n.end_ns, n.span_id, text=n.output_text)
            for c in n.requested_tool_calls:
                add("tool-call", n.end_ns, n.span_id, name=c.get("name"), arguments=c.get("arguments"),
                    id=c.get("id"))
            add("model-end", n.end_ns, n.span_id, usage=n.usage.to_json(), finish_reasons=n.finish_reasons,
                status=n.status)
        elif n.node_type == "tool":
            add("tool-start", n.start_ns, n.span_id, name=n.tool_name, arguments=n.arguments, id=n.tool_call_id)
            add("tool-result", n.end_ns, n.span_id, name=n.tool_name, result=n.result, error=n.tool_error,
                id=n.tool_call_id)
    add("terminal", run.end_ns, run.span_id, status=run.status, message=run.status_message)
    return steps
