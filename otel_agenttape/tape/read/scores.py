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
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ... import read_memory as memory
from ... import semconv as sc
from ..load import Reader, _rows
from .kept import store_version

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


HAS_SCORES = (f"SELECT (EXISTS (SELECT 1 FROM span_events WHERE name = '{sc.EVENT_EVALUATION_RESULT}') "
              f"OR EXISTS (SELECT 1 FROM log_records WHERE event_name = '{sc.EVENT_EVALUATION_RESULT}' "
              f"OR (event_name IS NULL AND attributes->'$.\"{sc.LOG_EVENT_NAME}\"'->>'s' = "
              f"'{sc.EVENT_EVALUATION_RESULT}'))) AS f")


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


def has_scores(reader: Reader) -> bool:
    """Whether the store holds any evaluation event (a few milliseconds; the ``scores`` view itself costs
    some 100 ms to plan, which a page of runs of a store without scores need not pay)."""
    return bool(_rows(reader, HAS_SCORES, [])[0]["f"])


def _latest(reader: Reader, refs: Sequence[str] | None) -> dict[str, dict[str, dict[str, Any]]]:
    where, params = "true", []
    if refs is not None:
        where, params = f"run_ref IN ({', '.join('?' for _ in refs)})", list(refs)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in _rows(reader, f"SELECT run_ref, name, s FROM ({LATEST}) WHERE {where} ORDER BY run_ref, name", params):
        out.setdefault(r["run_ref"], {})[r["name"]] = dict(r["s"])
    return out


# reader -> (version, every run's latest scores or None when too many to keep, their size in bytes)
_KEPT: weakref.WeakKeyDictionary[Any, tuple[Any, dict[str, dict[str, dict[str, Any]]] | None, int]] = (
    weakref.WeakKeyDictionary())
_KEPT_LOCK = threading.Lock()


def _scores_bytes(found: dict[str, dict[str, dict[str, Any]]]) -> int:
    return sum(len(by_name) for by_name in found.values()) * memory.SCORE_BYTES




def _drop_all() -> None:
    with _KEPT_LOCK:
        _KEPT.clear()


memory.register(lambda: sum(size for _, _, size in list(_KEPT.values())), _drop_all)


def forget(reader: Reader) -> None:
    """Let go of the scores kept for ``reader`` (it is being closed)."""
    with _KEPT_LOCK:
        try:
            _KEPT.pop(reader, None)
        except TypeError:
            pass


def _version(reader: Reader) -> Any:
    """What changes whenever a score can have arrived: the span count (``kept.store_version``) and, as a
    score can come as a log record alone, the log record count; None when there is no cheap such number."""
    version = store_version(reader)
    if version is None or getattr(reader, "fixed_version", None) is not None:
        return version
    return version, int(_rows(reader, "SELECT count(*) AS n FROM log_records", [])[0]["n"])


def latest_by_ref(reader: Reader, refs: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """ref -> name -> the latest score (value, label, explanation, source, version, span_id,
    time_unix_nano). On a store with a version every run's latest scores are read once per version and
    pages take theirs from them (the view costs about as much for one run as for all)."""
    if not refs:
        return {}
    version = _version(reader)
    if version is None:
        return _latest(reader, refs) if has_scores(reader) else {}
    try:
        kept = _KEPT.get(reader)
    except TypeError:
        kept = None
    if kept is not None and kept[0] == version:
        found = kept[1]
        if found is None:  # too many to keep at this version: these runs' alone
            found = _latest(reader, refs)
    else:
        found = _latest(reader, None) if has_scores(reader) else {}
        if kept is not None:  # the older version's go first: what is kept now is measured without them
            with _KEPT_LOCK:
                _KEPT.pop(reader, None)
        if _version(reader) == version:
            with _KEPT_LOCK:
                size = _scores_bytes(found)
                try:  # kept, or marked as too many for the read model's memory (read_memory.py)
                    _KEPT[reader] = (version, found, size) if memory.fits(size) else (version, None, 0)
                except TypeError:
                    pass
    return {r: {n: dict(v) for n, v in found[r].items()} for r in refs if r in found}


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
