"""What each ``/api/`` endpoint answers, computed from a read model (``otel_agenttape.open``'s object).

Plain functions from the read model and request parameters to JSON-ready values, so the HTTP layer
(``app.py``) only routes, authorizes and encodes. No SQL here: every read goes through the read model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RUN_FILTERS = ("agent", "status", "source", "session", "service", "model", "tool", "since", "until", "text",
               "parent", "score", "label")
MAX_PAGE = 500
PREVIEW = 240


class BadRequest(ValueError):
    """A parameter the API cannot use; answered 400 with the message."""


def _limit(raw: str | None, default: int = 50) -> int:
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"limit: not a number: {raw!r}") from None
    if not 1 <= value <= MAX_PAGE:
        raise BadRequest(f"limit: between 1 and {MAX_PAGE}")
    return value


def runs_page(tapes: Any, params: Mapping[str, str]) -> dict[str, Any]:
    """``GET /api/runs``: one page of runs, newest first, with the count of all that match."""
    filters = {k: params[k] for k in RUN_FILTERS if params.get(k) not in (None, "")}
    if params.get("q") and "text" not in filters:
        filters["text"] = params["q"]
    try:
        page = tapes.runs(**filters, limit=_limit(params.get("limit")), cursor=params.get("cursor") or None)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    return page.to_dict()


def _summary(tapes: Any, run: Any, parent_ref: str | None = None) -> dict[str, Any]:
    """A rebuilt run as the runs list shows it (``RunSummary.from_run``: the fields the runs view computes),
    without reading the whole ``runs`` view for one row."""
    from otel_agenttape.tape.read.summary import RunSummary
    from otel_agenttape.tape.refs import AmbiguousRunError, RunNotFound

    if parent_ref is None and run.parent_run_id:
        try:
            parent_ref = tapes.locate(run.parent_run_id)
        except (RunNotFound, AmbiguousRunError):
            parent_ref = f"{run.parent_run_id}@{run.trace_id}"
    out = RunSummary.from_run(run, parent_ref).to_dict()
    _put_cost(tapes, run, out)
    return out


def _put_cost(tapes: Any, run: Any, out: dict[str, Any]) -> None:
    """The run's own model calls priced now (``cost``: with each call's dollars), as the list has it."""
    from otel_agenttape.tape.read.cost import run_cost

    prices = getattr(tapes, "prices", None)
    if prices is None:
        return
    cost = run_cost(run, prices)
    out["cost"] = cost
    out["cost_usd"], out["priced_calls"], out["unpriced_calls"] = (
        cost["usd"], cost["priced_calls"], cost["unpriced_calls"])


def run_summary(tapes: Any, ref: str) -> dict[str, Any]:
    """``GET /api/runs/{ref}``: the run as the list shows it."""
    return _summary(tapes, tapes.rebuild(ref))


def _memo(tapes: Any, key: Any, compute: Any) -> Any:
    """An answer kept by the read model until its store changes (a read model without ``memo``, as some
    tests pass, computes every time)."""
    memo = getattr(tapes, "memo", None)
    return compute() if memo is None else memo(key, compute)


def steps(tapes: Any, ref: str) -> dict[str, Any]:
    """``GET /api/runs/{ref}/steps``: the ordered step stream."""
    return {"ref": ref, "steps": _memo(tapes, ("steps", ref), lambda: tapes.steps(ref))}


def _node(n: Any) -> dict[str, Any]:
    out = n.summary()
    out.update({
        "node_id": n.node_id, "parent_span_id": n.parent_span_id, "start_ns": n.start_ns, "end_ns": n.end_ns,
        "duration_ms": max(0, n.end_ns - n.start_ns) / 1e6, "status_message": n.status_message,
        "step": n.step, "turn_id": n.turn_id, "convention": n.convention,
    })
    if n.node_type == "model":
        out.update({"provider": n.provider, "usage": n.usage.to_json(), "reasoning": n.reasoning or None,
                    "finish_reasons": list(n.finish_reasons), "retry_count": n.retry_count,
                    "output_messages": [m.to_json() for m in n.output_messages],
                    "request": n.request or None})
    return out


def nodes(tapes: Any, ref: str) -> dict[str, Any]:
    """``GET /api/runs/{ref}/nodes``: every model and tool node with its full input and output, and totals."""
    run = tapes.rebuild(ref)
    listed = [_node(n) for n in run.nodes]
    cost: dict[str, Any] = {}
    _put_cost(tapes, run, cost)
    by_span = {c["span_id"]: c["usd"] for c in cost.get("cost", {}).get("calls", [])}
    for n in listed:
        if n["type"] == "model" and "cost" in cost:
            n["cost_usd"] = by_span.get(n["span_id"])
    return {
        "ref": ref,
        "nodes": listed,
        "totals": {
            "duration_ms": run.duration_ms,
            "model_calls": len(run.model_nodes),
            "tool_calls": len(run.tool_nodes),
            "usage": run.usage.to_json(),
            "errors": sum(1 for n in run.nodes if n.status == "error"),
            "cost": {k: v for k, v in cost.get("cost", {}).items() if k != "calls"} or None,
        },
    }


def _flat_spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for rs in doc.get("resourceSpans", []):
        service = next((a["value"].get("stringValue") for a in rs.get("resource", {}).get("attributes", [])
                        if a.get("key") == "service.name"), None)
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                attrs = {a["key"]: a.get("value", {}) for a in s.get("attributes", [])}
                op = attrs.get("gen_ai.operation.name", {}).get("stringValue")
                out.append({
                    "span_id": s.get("spanId"), "parent_span_id": s.get("parentSpanId") or None,
                    "trace_id": s.get("traceId"), "name": s.get("name"),
                    "start_ns": int(s.get("startTimeUnixNano") or 0), "end_ns": int(s.get("endTimeUnixNano") or 0),
                    "status": {0: "unset", 1: "ok", 2: "error"}.get(int(s.get("status", {}).get("code") or 0)),
                    "operation": op, "service": service, "events": len(s.get("events", [])),
                })
    out.sort(key=lambda s: (s["start_ns"], s["span_id"] or ""))
    return out


def timeline(tapes: Any, ref: str) -> dict[str, Any]:
    """``GET /api/runs/{ref}/spans``: the run's spans as a waterfall (start, end, depth)."""
    spans = _flat_spans(tapes.spans_otlp(ref))
    by_id = {s["span_id"]: s for s in spans}
    for s in spans:
        depth, cur, seen = 0, s["parent_span_id"], set()
        while cur in by_id and cur not in seen:
            seen.add(cur)
            depth += 1
            cur = by_id[cur]["parent_span_id"]
        s["depth"] = depth
    start = min((s["start_ns"] for s in spans), default=0)
    end = max((s["end_ns"] for s in spans), default=0)
    return {"ref": ref, "start_ns": start, "end_ns": end, "spans": spans}


def otlp(tapes: Any, ref: str) -> dict[str, Any]:
    """``GET /api/runs/{ref}/otlp``: the run's spans as an OTLP JSON export request."""
    return tapes.spans_otlp(ref)


def replay(tapes: Any, ref: str, tree: bool) -> dict[str, Any]:
    """``GET /api/runs/{ref}/replay[?tree=1]``: what ``agenttape replay --json [--tree]`` prints."""
    return tapes.replay(ref, tree=tree)


def tree(tapes: Any, ref: str) -> dict[str, Any]:
    """``GET /api/runs/{ref}/tree``: the run and every child run, each with an output preview and tool calls."""
    return _memo(tapes, ("tree", ref), lambda: _tree(tapes, ref))


def _tree(tapes: Any, ref: str) -> dict[str, Any]:
    from otel_agenttape.tape.rebuild import reconstruct_tree

    root = reconstruct_tree(tapes.reader, ref).root
    count = 0

    def node(run: Any, parent: str | None) -> dict[str, Any]:
        nonlocal count
        count += 1
        out = _summary(tapes, run, parent)
        text = str(run.output or "")
        out["output_preview"] = text[:PREVIEW] + ("…" if len(text) > PREVIEW else "")
        out["tool_list"] = [{"name": t.name, "error": bool(t.error)} for t in run.tools]
        out["children"] = [node(c, out["ref"]) for c in run.children]
        out.pop("cost", None)  # the run's calls: on its run page
        return out

    top = node(root, None)
    return {"ref": ref, "runs": count, "root": top, "tree_cost": _tree_cost(top)}


def _tree_cost(root: dict[str, Any]) -> dict[str, Any]:
    """Every run of a tree priced once: its own calls (``cost_usd``) added up."""
    usd, priced, unpriced = None, 0, 0
    stack = [root]
    while stack:
        n = stack.pop()
        stack.extend(n["children"])
        if n.get("priced_calls"):
            usd = (usd or 0.0) + float(n["cost_usd"] or 0.0)
        priced += int(n.get("priced_calls") or 0)
        unpriced += int(n.get("unpriced_calls") or 0)
    return {"usd": usd if usd is not None or unpriced else 0.0, "priced_calls": priced, "unpriced_calls": unpriced}


def session(tapes: Any, session_id: str) -> dict[str, Any]:
    """``GET /api/sessions/{id}``: the session's turns, oldest first, each with its input and output."""
    from otel_agenttape.tape.read.cost import total_of

    turns = []
    listed = tapes.session(session_id)
    for s in listed:
        d = s.to_dict()
        rep = tapes.replay(d["ref"])
        d["input"] = rep.get("input", [])
        d["output"] = rep.get("output", "")
        turns.append(d)
    return {"session_id": session_id, "turns": turns, "cost": total_of(listed)}


def diff(tapes: Any, a: str | None, b: str | None) -> dict[str, Any]:
    """``GET /api/diff?a=REF&b=REF``: the first divergent node, plus both runs' nodes to show side by side."""
    if not a or not b:
        raise BadRequest("diff needs a=REF and b=REF")
    out = tapes.diff(a, b)
    for side, ref in (("a", a), ("b", b)):
        run = tapes.rebuild(ref)
        out[f"nodes_{side}"] = [_node(n) for n in run.nodes]
        out[f"agent_{side}"] = run.agent
    return out


def _checkpoints(tapes: Any) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The signed checkpoints the store holds, by tape and epoch: size, root and who signed."""
    import base64

    from otel_agenttape.integrity.checkpoint import Checkpoint, CheckpointError, parse_origin
    from otel_agenttape.integrity.note import NoteError, split_note
    from otel_agenttape.tape.verification import store_notes

    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    reader = getattr(tapes, "reader", None)
    if reader is None:
        return out
    for note, source in store_notes(reader):
        try:
            text, sigs = split_note(note)
            cp = Checkpoint.parse(text)
            key = parse_origin(cp.origin)
        except (NoteError, CheckpointError, ValueError):
            continue
        out.setdefault(key, []).append({
            "size": cp.size, "root": base64.b64encode(cp.root).decode(), "chain_head": cp.chain_head,
            "signatures": [{"key": s.name, "key_id": s.id.hex()} for s in sigs], "source": source,
        })
    for cps in out.values():
        cps.sort(key=lambda c: c["size"])
    return out


def verify(tapes: Any, tape: str | None) -> dict[str, Any]:
    """``GET /api/verify[?tape=ID]``: each tape verified, or broken at index N with the reason, and its
    signed checkpoints."""
    reports = tapes.verify(tape or None)
    cps = _checkpoints(tapes) if reports else {}
    for r in reports:
        r["checkpoints"] = cps.get((r["chain_id"], int(r.get("epoch") or 0)), [])
    return {"tapes": reports}


def run_scores(tapes: Any, ref: str) -> dict[str, Any]:
    """``GET /api/runs/{ref}/scores``: every score of the run and its nodes, oldest first (failed
    evaluations too, with their ``error_type``)."""
    full = tapes.locate(ref)
    return {"ref": full, "scores": tapes.scores(full, errors=True)}


def info(tapes: Any, token_required: bool, annotate: bool = False) -> dict[str, Any]:
    """``GET /api/info``: what the console reads, and whether it takes annotations."""
    return {"source": getattr(tapes, "description", ""), "token_required": token_required, "annotate": annotate}


class NotFound(LookupError):
    """Nothing by that name; answered 404 with the message."""


def experiments(tapes: Any) -> dict[str, Any]:
    """``GET /api/experiments``: every experiment, newest first, with its summary against the originals
    (runs, errors, answers changed, tool agreement, tokens, cost, latency)."""
    return {"experiments": tapes.experiments(summary=True)}


def experiment(tapes: Any, name: str, params: Mapping[str, str], evals: list[str]) -> dict[str, Any]:
    """``GET /api/experiments/{name}[?baseline=OTHER&eval=E]``: the experiment compared pair by pair,
    original (or the other experiment) and candidate per node."""
    from otel_agenttape.tape.experiment import ExperimentError

    known = {e["name"] for e in tapes.experiments()}
    if name not in known:
        raise NotFound(f"no experiment named {name!r}")
    baseline = params.get("baseline") or "original"
    if baseline != "original" and baseline not in known:
        raise NotFound(f"no experiment named {baseline!r} to compare with")
    try:
        return tapes.experiment_detail(name, baseline=baseline, evals=evals)
    except ExperimentError as exc:
        raise BadRequest(str(exc)) from None
