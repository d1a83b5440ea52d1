"""Where two runs part ways: the first node whose type, request or result differs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .model import Node, Run

_IGNORED = ("span_id",)


def _comparable(node: Node) -> dict[str, Any]:
    return {k: v for k, v in node.summary().items() if k not in _IGNORED}


@dataclass
class RunDiff:
    """The first divergence: its node position, both sides (None past a run's end) and the fields."""

    index: int
    a: dict[str, Any] | None
    b: dict[str, Any] | None
    fields: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "fields": self.fields, "a": self.a, "b": self.b}


def diff_runs(a: Run, b: Run) -> RunDiff | None:
    """None when the two runs made the same calls with the same results and ended the same way."""
    for i in range(max(len(a.nodes), len(b.nodes))):
        left = _comparable(a.nodes[i]) if i < len(a.nodes) else None
        right = _comparable(b.nodes[i]) if i < len(b.nodes) else None
        if left != right:
            keys = sorted(set(left or {}) | set(right or {}))
            fields = [k for k in keys if (left or {}).get(k) != (right or {}).get(k)]
            return RunDiff(i, left, right, fields)
    ends = {"output": (a.output, b.output), "status": (a.status, b.status)}
    fields = [k for k, (x, y) in ends.items() if x != y]
    if fields:
        side = lambda r: {"type": "end", "status": r.status, "output": r.output}  # noqa: E731
        return RunDiff(len(a.nodes), side(a), side(b), fields)
    return None
