"""Scores read back: the ``scores`` view's rows (``Tapes.scores``), each run's latest score of every name
(``RunSummary.scores``) and the ``--score NAME>=V`` / ``--label NAME=L`` filters of ``runs`` and ``dataset``.

A run's score of a name is the latest one given (a later human correction overrides an earlier judge),
on the run or on any of its nodes; an evaluation that failed (``error.type``, no value or label) is
listed by ``Tapes.scores`` but never counts as a score. The filters' SQL and their check on a summary
read the same latest scores, so a page and the dataset select the same runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..load import Reader, _rows

# Longest first, so ``>=`` is not read as ``>`` followed by ``=0.8``.
OPS = (">=", "<=", ">", "<", "=")
_SPLIT = re.compile(r"^\s*([^<>=]+?)\s*(>=|<=|>|<|=)\s*(.+?)\s*$")

SCORE_COLUMNS = ("run_ref, trace_id, span_id, name, value, label, explanation, source, version, response_id, "
                 "error_type, time_unix_nano, score_id, via, given_trace_id, given_span_id")

# The latest score of each name of each run (failed evaluations left out).
LATEST = ("SELECT run_ref, name, arg_max(struct_pack(value := value, label := label, explanation := explanation, "
          "source := source, version := version, span_id := span_id, time_unix_nano := time_unix_nano), "
          "struct_pack(t := time_unix_nano, i := coalesce(score_id, ''))) AS s "
          "FROM scores WHERE error_type IS NULL AND run_ref IS NOT NULL AND name IS NOT NULL GROUP BY run_ref, name")


@dataclass(frozen=True)
class ScoreFilter:
    """``NAME>=V`` (``>=``, ``>``, ``<=``, ``<``, ``=``): runs whose latest ``NAME`` score's value passes."""

    name: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> ScoreFilter:
        m = _SPLIT.match(str(text or ""))
        if not m:
            raise ValueError(f"score filter {text!r}: give NAME>=VALUE (or >, <=, <, =), e.g. helpfulness>=0.8")
        name, op, raw = m.groups()
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"score filter {text!r}: {raw!r} is not a number (a label is --label NAME=LABEL)") from None
        if not math.isfinite(value):
            raise ValueError(f"score filter {text!r}: not a finite number")
        return cls(name, op, value)

    def text(self) -> str:
        return f"{self.name}{self.op}{self.value:g}"

    def sql(self) -> tuple[str, list[Any]]:
        """A condition on ``ref``: the run's latest score of the name passes."""
        op = "=" if self.op == "=" else self.op
        return (f"ref IN (SELECT run_ref FROM ({LATEST}) WHERE name = ? AND s.value {op} ?)",
                [self.name, self.value])

    def check(self, scores: dict[str, dict[str, Any]]) -> str | None:
        """Why a run with these latest scores does not pass (a dataset's skip reason), or None."""
        got = scores.get(self.name)
        if got is None or got.get("value") is None:
            return f"no_score:{self.name}"
        v = float(got["value"])
        ok = {">=": v >= self.value, ">": v > self.value, "<=": v <= self.value, "<": v < self.value,
              "=": v == self.value}[self.op]
        return None if ok else f"score_not_met:{self.text()}"


@dataclass(frozen=True)
class LabelFilter:
    """``NAME=LABEL``: runs whose latest ``NAME`` score has this label."""

    name: str
    label: str

    @classmethod
    def parse(cls, text: str) -> LabelFilter:
        name, eq, label = str(text or "").partition("=")
        if not eq or not name.strip() or not label.strip():
            raise ValueError(f"label filter {text!r}: give NAME=LABEL, e.g. correctness=pass")
        return cls(name.strip(), label.strip())

    def text(self) -> str:
        return f"{self.name}={self.label}"

    def sql(self) -> tuple[str, list[Any]]:
        return (f"ref IN (SELECT run_ref FROM ({LATEST}) WHERE name = ? AND s.label = ?)", [self.name, self.label])

    def check(self, scores: dict[str, dict[str, Any]]) -> str | None:
        got = scores.get(self.name)
        if got is None or got.get("label") is None:
            return f"no_label:{self.name}"
        return None if got["label"] == self.label else f"label_not_met:{self.text()}"


def _texts(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None or value == "" or value == ():
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def score_filters(score: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """The ``score=`` argument (one text or several, all must pass) checked and written canonically."""
    texts = _texts(score)
    return tuple(ScoreFilter.parse(t).text() for t in texts) if texts else None


def label_filters(label: str | Sequence[str] | None) -> tuple[str, ...] | None:
    texts = _texts(label)
    return tuple(LabelFilter.parse(t).text() for t in texts) if texts else None


def parsed(score: Iterable[str] | None, label: Iterable[str] | None) -> list[ScoreFilter | LabelFilter]:
    return [*(ScoreFilter.parse(t) for t in score or ()), *(LabelFilter.parse(t) for t in label or ())]


def skip_reason(filters: Sequence[ScoreFilter | LabelFilter], scores: dict[str, dict[str, Any]]) -> str | None:
    """The first filter these latest scores fail, as a reason, or None when they pass all."""
    for f in filters:
        reason = f.check(scores)
        if reason is not None:
            return reason
    return None


def latest_by_ref(reader: Reader, refs: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """ref -> name -> the latest score (value, label, explanation, source, version, span_id,
    time_unix_nano)."""
    if not refs:
        return {}
    marks = ", ".join("?" for _ in refs)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in _rows(reader, f"SELECT run_ref, name, s FROM ({LATEST}) WHERE run_ref IN ({marks}) "
                           "ORDER BY run_ref, name", list(refs)):
        out.setdefault(r["run_ref"], {})[r["name"]] = dict(r["s"])
    return out


def score_summaries(reader: Reader, runs: Sequence[Any]) -> None:
    """Set ``scores`` on these ``RunSummary`` rows in place."""
    if not runs:
        return
    found = latest_by_ref(reader, sorted({r.ref for r in runs}))
    for r in runs:
        r.scores = found.get(r.ref, {})


def list_scores(reader: Reader, *, ref: str | None = None, name: str | None = None, source: str | None = None,
                span_id: str | None = None, errors: bool = True) -> list[dict[str, Any]]:
    """The ``scores`` view's rows, oldest first."""
    clauses, params = [], []
    for column, value in (("run_ref", ref), ("name", name), ("source", source), ("span_id", span_id)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if not errors:
        clauses.append("error_type IS NULL")
    where = " AND ".join(clauses) or "true"
    return _rows(reader, f"SELECT {SCORE_COLUMNS} FROM scores WHERE {where} "
                         "ORDER BY time_unix_nano, coalesce(score_id, ''), run_ref", params)
