"""Compare an experiment with its baseline (the original nodes, or another experiment), run by run.

Per pair: whether the answer changed (exactly, and after normalising whitespace and case), whether the
tool calls agree (same names and arguments, in any order), tokens, latency, cost and evaluator scores;
then a summary and gates (``correctness<0.9``) for CI. Cost is each side's model call priced by the read
model's prices (genai-prices and the user's overrides, ``tape/read/cost.py``): a model without a price
has an unknown cost (None), never 0. Scores come from evaluators registered by name (``register_evaluator``).
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .experiment import ExperimentError, experiment_refs, latest_per_node
from .model import Node, Run, Usage
from .rebuild import iter_runs

Evaluator = Callable[[Node], "float | None"]

EVALUATORS: dict[str, Evaluator] = {}


def register_evaluator(name: str, fn: Evaluator | None) -> None:
    """A named evaluator ``--eval NAME`` runs on both sides: node -> score in [0, 1] or None."""
    if fn is None:
        EVALUATORS.pop(name, None)
    else:
        EVALUATORS[name] = fn


class NodeRun:
    """A model node as a run evaluator (``tape.evaluate.Evaluator``) sees a run: ``output`` is its answer's
    text, ``input`` its prompt, ``duration_ms`` its call's; any other name is the node's own field."""

    def __init__(self, node: Node) -> None:
        self.node = node

    @property
    def output(self) -> str:
        return self.node.output_text

    @property
    def input(self) -> list[Any]:
        return self.node.prompt

    @property
    def input_text(self) -> str:
        """The last user message's text (what a reference file's ``input`` is matched with)."""
        from .evaluate import last_user_text

        return last_user_text(self.node.prompt)

    @property
    def duration_ms(self) -> float:
        return (self.node.end_ns - self.node.start_ns) / 1e6

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.node, name)


def on_nodes(ev: Any) -> Evaluator:
    """A run evaluator (a built-in of ``agenttape eval``, or ``MODULE:FUNCTION``) as a node evaluator: its
    value on each side's model call (None when it fails or does not apply)."""

    def score(node: Node) -> float | None:
        res = ev(NodeRun(node))
        return None if res is None or res.error_type else res.value

    return score


# built-ins of ``agenttape eval`` that read what one model call holds: ``NAME`` or ``NAME=ARGUMENT``
_NODE_BUILTINS = {"json_valid": None, "regex": "pattern", "contains": "pattern", "exact_match": "reference",
                  "latency_budget": "budget_ms"}


def resolve_evaluator(spec: str) -> tuple[str, Evaluator] | None:
    """``--eval SPEC`` as (metric name, node evaluator): one registered by that name, or a built-in run
    evaluator given as ``json_valid``, ``contains=TEXT``, ``regex=RE``, ``exact_match=FILE`` or
    ``latency_budget=MS``, named by the built-in (``regex``); None: neither."""
    if spec in EVALUATORS:
        return spec, EVALUATORS[spec]
    name, eq, arg = spec.partition("=")
    if name not in _NODE_BUILTINS:
        return None
    from .evaluators import builtin

    option = _NODE_BUILTINS[name]
    if option is None and eq:
        raise ExperimentError(f"--eval {spec}: {name} takes no argument")
    if option is not None and not arg:
        raise ExperimentError(f"--eval {spec}: give {name}=ARGUMENT (its {option})")
    kwargs: dict[str, Any] = {}
    if option == "budget_ms":
        try:
            kwargs[option] = float(arg)
        except ValueError:
            raise ExperimentError(f"--eval {spec}: {arg!r} is not a number of milliseconds") from None
    elif option is not None:
        kwargs[option] = arg
    try:
        ev = builtin(name, **kwargs)
    except (ValueError, OSError) as exc:
        raise ExperimentError(f"--eval {spec}: {exc}") from None
    return name, on_nodes(ev)


def node_cost(node: Node | None, prices: Any) -> float | None:
    """One model node's dollars at ``prices`` (None: no node, no prices, or no price for its model)."""
    if node is None or prices is None:
        return None
    from .read.cost import node_call

    c = node_call(node)
    return prices.call_usd(c["provider"], c["model"], c["input_tokens"], c["output_tokens"],
                           c["cache_read_tokens"], c["cache_write_tokens"], c["start_ns"])


_SPACE = re.compile(r"\s+")


def normalise(text: str | None) -> str:
    """Whitespace collapsed, case folded, ends stripped: what "the same answer" means loosely."""
    return _SPACE.sub(" ", (text or "").strip()).casefold()


def _answer(node: Node | None) -> str:
    if node is None:
        return ""
    if node.output_text:
        return node.output_text
    return "".join(m.text for m in node.output_messages)


def _calls(node: Node | None) -> list[tuple[str, str]]:
    out = []
    for c in (node.requested_tool_calls if node is not None else []):
        args = c.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        out.append((str(c.get("name")), json.dumps(args, sort_keys=True, separators=(",", ":"))))
    return sorted(out)


def _ms(node: Node | None) -> float | None:
    return None if node is None else max(0, node.end_ns - node.start_ns) / 1e6


@dataclass
class Pair:
    """One original node and its candidate answer, compared."""

    of: str
    node: str
    candidate_ref: str | None
    baseline_ref: str | None
    baseline: Node | None
    candidate: Node | None
    error: str | None = None
    scores: dict[str, dict[str, float | None]] = field(default_factory=dict)
    costs: dict[str, float | None] = field(default_factory=dict)  # USD per side, priced when compared

    @property
    def same_exact(self) -> bool | None:
        if self.baseline is None or self.candidate is None or self.error:
            return None
        return _answer(self.baseline) == _answer(self.candidate) and _calls(self.baseline) == _calls(self.candidate)

    @property
    def same_normalised(self) -> bool | None:
        if self.baseline is None or self.candidate is None or self.error:
            return None
        return (normalise(_answer(self.baseline)) == normalise(_answer(self.candidate))
                and _calls(self.baseline) == _calls(self.candidate))

    @property
    def tools_agree(self) -> bool | None:
        if self.baseline is None or self.candidate is None or self.error:
            return None
        return _calls(self.baseline) == _calls(self.candidate)

    def side(self, node: Node | None) -> dict[str, Any]:
        return {"answer": _answer(node), "tool_calls": [{"name": n, "arguments": json.loads(a)} for n, a in _calls(node)],
                "input_tokens": node.usage.input_tokens if node else None,
                "output_tokens": node.usage.output_tokens if node else None,
                "latency_ms": _ms(node), "cost_usd": self.cost_of(node), "model": node.model if node else None}

    def cost_of(self, node: Node | None) -> float | None:
        if node is None:
            return None
        return self.costs.get("baseline" if node is self.baseline else "candidate")

    def to_json(self) -> dict[str, Any]:
        return {"of": self.of, "node": self.node, "candidate_ref": self.candidate_ref,
                "baseline_ref": self.baseline_ref, "error": self.error, "same_exact": self.same_exact,
                "same_normalised": self.same_normalised, "tools_agree": self.tools_agree,
                "baseline": self.side(self.baseline), "candidate": self.side(self.candidate),
                "scores": self.scores}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _rate(flags: Sequence[bool | None]) -> float | None:
    known = [f for f in flags if f is not None]
    return sum(1 for f in known if f) / len(known) if known else None


def _total(values: Sequence[float | None]) -> float | None:
    """A sum only when every part is known: an unknown cost is not zero."""
    if not values or any(v is None for v in values):
        return None
    return float(sum(values))  # type: ignore[arg-type]


@dataclass
class Comparison:
    name: str
    baseline: str
    pairs: list[Pair]
    evals: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ok = [p for p in self.pairs if not p.error and p.candidate is not None]
        out: dict[str, Any] = {
            "runs": len(self.pairs), "errors": sum(1 for p in self.pairs if p.error),
            "error_rate": (sum(1 for p in self.pairs if p.error) / len(self.pairs)) if self.pairs else None,
            "answer_same": _rate([p.same_exact for p in self.pairs]),
            "answer_same_normalised": _rate([p.same_normalised for p in self.pairs]),
            "answer_changed": sum(1 for p in self.pairs if p.same_exact is False),
            "answer_changed_normalised": sum(1 for p in self.pairs if p.same_normalised is False),
            "tool_agreement": _rate([p.tools_agree for p in self.pairs]),
        }
        for side in ("baseline", "candidate"):
            nodes = [getattr(p, side) for p in (ok if side == "candidate" else self.pairs)]
            nodes = [n for n in nodes if n is not None]
            out[f"{side}_input_tokens"] = sum(n.usage.input_tokens or 0 for n in nodes)
            out[f"{side}_output_tokens"] = sum(n.usage.output_tokens or 0 for n in nodes)
            out[f"{side}_latency_ms"] = _mean([_ms(n) for n in nodes])  # type: ignore[misc]
            pairs = ok if side == "candidate" else [p for p in self.pairs if p.baseline is not None]
            out[f"{side}_cost_usd"] = _total([p.costs.get(side) for p in pairs])
        for name in self.evals:
            for side in ("baseline", "candidate"):
                vals = [p.scores.get(name, {}).get(side) for p in self.pairs]
                known = [v for v in vals if v is not None]
                out[f"{name}" if side == "candidate" else f"{name}_baseline"] = _mean(known)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "baseline": self.baseline, "summary": self.summary(),
                "runs": [p.to_json() for p in self.pairs]}


def _tree_runs(run: Run) -> list[Run]:
    out, stack, seen = [], [run], set()
    while stack:
        r = stack.pop()
        if id(r) not in seen:
            seen.add(id(r))
            out.append(r)
            stack.extend(r.children)
    return out


def _run_as_node(run: Run) -> Node:
    """A whole run seen as one answer (program-level experiments): its output, every tool call asked for
    in it and the runs below it (a program's agents are the experiment run's children), their tokens,
    its duration."""
    models = sorted((n for r in _tree_runs(run) for n in r.model_nodes), key=lambda n: (n.start_ns, n.span_id))
    asked = [m for n in models for m in n.output_messages if m.tool_calls]
    usage = Usage()
    for n in models:
        usage.add(n.usage)
    return Node("model", run.trace_id, run.span_id or "", None, run.agent or "", run.start_ns, run.end_ns,
                run.status, output_text=run.output, output_messages=asked, usage=usage,
                model=next((n.model for n in reversed(models) if n.model), None) or (run.models[-1] if run.models else None))


def _node_of(run: Run | None, span_id: str | None) -> Node | None:
    if run is None:
        return None
    if span_id == "":
        return _run_as_node(run)
    models = run.model_nodes
    if span_id:
        return next((n for n in models if n.span_id == span_id), None)
    return models[0] if models else None


def _error_of(run: Run | None) -> str | None:
    if run is None:
        return "candidate run not found"
    if run.status == "error":
        return run.status_message or next((n.status_message for n in run.nodes if n.status == "error"), None) or "error"
    return None


def compare(tapes: Any, name: str, *, baseline: str = "original", evals: Sequence[str] = (),
            prompts: bool | None = None) -> Comparison:
    """The experiment ``name`` against ``baseline``: ``"original"`` (the recorded nodes) or another
    experiment's name (matched by original run and node).

    A node-level experiment reads only the model calls compared (``iter_answers``, in trace batches), not
    whole runs; ``prompts`` (default: when evaluators are named, as they may read them) also reads each
    side's prompt (``Node.prompt``), which the comparison itself does not need."""
    resolved: dict[str, Evaluator] = {}
    missing = []
    for e in evals:
        got = resolve_evaluator(e)
        if got is None:
            missing.append(e)
        elif got[0] in resolved:
            raise ExperimentError(f"two evaluators would both be reported as {got[0]!r}: give one of them "
                                  "a name of its own (register_evaluator)")
        else:
            resolved[got[0]] = got[1]
    if missing:
        raise ExperimentError(f"no evaluator named {', '.join(missing)} (registered: "
                              f"{', '.join(sorted(EVALUATORS)) or 'none'}; built in: "
                              f"{', '.join(n if o is None else f'{n}=...' for n, o in _NODE_BUILTINS.items())})")
    mine = experiment_refs(tapes, name)
    if not mine:
        raise ExperimentError(f"no experiment named {name!r}")
    latest = latest_per_node(mine.items())
    other: dict[tuple[str, str], str] = {}
    if baseline != "original":
        theirs = experiment_refs(tapes, baseline)
        if not theirs:
            raise ExperimentError(f"no experiment named {baseline!r} to compare with")
        other = latest_per_node(theirs.items())
    program = any(node == "" for _, node in latest)
    if program:
        candidates, base_of = _whole_runs(tapes, latest, baseline, other)
    else:
        candidates, base_of = _model_calls(tapes, latest, baseline, other, bool(evals) if prompts is None else prompts)
    prices = getattr(tapes, "prices", None)
    pairs = []
    for key, ref in sorted(latest.items()):
        node, error = candidates[ref]
        base_ref, base_node = base_of[key]
        pair = Pair(key[0], key[1], ref, base_ref, base_node, node, error)
        pair.costs = {"baseline": node_cost(base_node, prices), "candidate": node_cost(pair.candidate, prices)}
        for e, fn in resolved.items():
            pair.scores[e] = {"baseline": _score(fn, base_node),
                              "candidate": None if pair.error else _score(fn, pair.candidate)}
        pairs.append(pair)
    return Comparison(name, baseline, pairs, list(resolved))


Sides = tuple[dict[str, tuple["Node | None", "str | None"]], dict[tuple[str, str], tuple["str | None", "Node | None"]]]


def _whole_runs(tapes: Any, latest: dict[tuple[str, str], str], baseline: str,
                other: dict[tuple[str, str], str]) -> Sides:
    """Program level: each run with the runs below it in its trace, seen as one answer."""
    runs = {r.ref: r for r in iter_runs(tapes.reader, list(latest.values()), children=True)}
    candidates = {ref: (_node_of(runs.get(ref), ""), _error_of(runs.get(ref))) for ref in latest.values()}
    if baseline == "original":
        originals = {r.ref: r for r in iter_runs(tapes.reader, sorted({of for of, _ in latest if "@" in of}),
                                                 children=True)}
        return candidates, {k: (k[0], _node_of(originals.get(k[0]), k[1])) for k in latest}
    theirs = {r.ref: r for r in iter_runs(tapes.reader, [other[k] for k in latest if k in other], children=True)}
    return candidates, {k: (other.get(k), _node_of(theirs.get(other.get(k, "")), "")) for k in latest}


def _model_calls(tapes: Any, latest: dict[tuple[str, str], str], baseline: str,
                 other: dict[tuple[str, str], str], prompts: bool) -> Sides:
    """Node level: the candidate run's model call and the original's (or the other experiment's) only."""
    from .rebuild import iter_answers

    wanted: list[tuple[str, str | None]] = [(ref, None) for ref in latest.values()]
    if baseline == "original":
        wanted += sorted({(of, node) for of, node in latest if "@" in of})
    else:
        wanted += [(other[k], None) for k in latest if k in other]
    got = dict(iter_answers(tapes.reader, wanted, prompt=prompts))
    candidates = {}
    for ref in latest.values():
        answer = got.get((ref, None))
        if answer is None or not answer.run_found:
            candidates[ref] = (None, "candidate run not found")
            continue
        error = None
        if answer.status == "error":
            node = answer.node
            error = answer.status_message or (node.status_message if node is not None and node.status == "error"
                                              else None) or "error"
        candidates[ref] = (answer.node, error)
    if baseline == "original":
        base = {k: (k[0], got[(k[0], k[1])].node if (k[0], k[1]) in got else None) for k in latest}
    else:
        base = {k: (other.get(k), got[(other[k], None)].node if k in other and (other[k], None) in got else None)
                for k in latest}
    return candidates, base


def _score(fn: Evaluator, node: Node | None) -> float | None:
    if node is None:
        return None
    try:
        value = fn(node)
    except Exception:
        return None
    return None if value is None else float(value)


_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq,
        "!=": operator.ne}
_GATE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|!=|<|>)\s*(-?[\d.]+(?:e-?\d+)?)\s*$")


@dataclass
class GateResult:
    gate: str
    metric: str
    value: float | None
    failed: bool

    def to_json(self) -> dict[str, Any]:
        return {"gate": self.gate, "metric": self.metric, "value": self.value, "failed": self.failed}


def check_gates(summary: dict[str, Any], gates: Sequence[str]) -> list[GateResult]:
    """Each ``--fail-if`` gate (``metric<0.9``): failed when the condition holds, or the metric is unknown."""
    out = []
    for gate in gates:
        m = _GATE.match(gate)
        if not m:
            raise ExperimentError(f"gate {gate!r}: write METRIC<NUMBER (or <=, >, >=, ==, !=)")
        metric, op, number = m.group(1), m.group(2), float(m.group(3))
        if metric not in summary:
            raise ExperimentError(f"gate {gate!r}: no metric {metric!r} (known: {', '.join(sorted(summary))})")
        value = summary[metric]
        failed = value is None or bool(_OPS[op](float(value), number))
        out.append(GateResult(gate, metric, None if value is None else float(value), failed))
    return out


def experiment_overview(tapes: Any, cache: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every experiment (``experiment_list``'s row) with its comparison summary against the originals:
    what the console's Experiments page lists.

    With ``cache`` (the Tapes' own), an experiment is compared again only when its runs changed: the
    summary is kept under the count of its runs and their first and last start (a rerun adds runs, the
    store never changes one) and the prices it was priced at; one query lists them all, so a page over
    unchanged experiments costs that query alone."""
    from .experiment import experiment_list

    out = []
    prices = getattr(tapes, "prices", None)
    rows = experiment_list(tapes)
    for row in rows:
        key = (row["runs"], row["first_ns"], row["last_ns"], row["originals"])
        hit = cache.get(row["name"]) if cache is not None else None
        if hit is not None and hit[0] == key and hit[1] is prices:
            summary = hit[2]
        else:
            summary = compare(tapes, row["name"]).summary()
            if cache is not None:
                cache[row["name"]] = (key, prices, summary)
        out.append({**row, "summary": dict(summary)})
    if cache is not None:
        for gone in set(cache) - {r["name"] for r in rows}:
            del cache[gone]
    return out


def _prompt(node: Node | None) -> list[dict[str, Any]]:
    return [] if node is None else [m.to_json() for m in node.prompt]


def experiment_detail(tapes: Any, name: str, *, baseline: str = "original",
                      evals: Sequence[str] = ()) -> dict[str, Any]:
    """One experiment compared pair by pair, each side with the prompt it was sent, and the scores the
    store holds for the original and candidate runs: what the console's side-by-side page shows."""
    from .experiment import experiment_list

    cmp = compare(tapes, name, baseline=baseline, evals=evals, prompts=True)
    out = cmp.to_json()
    out["experiment"] = next((e for e in experiment_list(tapes) if e["name"] == name), None)
    refs = {r for p in cmp.pairs for r in (p.candidate_ref, p.baseline_ref, p.of) if r and "@" in r}
    from .read.scores import latest_by_ref

    scored = latest_by_ref(tapes.reader, sorted(refs)) if refs else {}
    for pair, row in zip(cmp.pairs, out["runs"]):
        row["_order"] = (pair.of, pair.baseline.start_ns if pair.baseline is not None else 0, pair.node)
        row["baseline"]["input"] = _prompt(pair.baseline)
        row["candidate"]["input"] = _prompt(pair.candidate)
        row["original_scores"] = scored.get(pair.of, {})
        row["baseline_scores"] = scored.get(pair.baseline_ref or "", {})
        row["candidate_scores"] = scored.get(pair.candidate_ref or "", {})
    out["runs"].sort(key=lambda r: r.pop("_order"))  # each original run's nodes in the order they ran
    return out
