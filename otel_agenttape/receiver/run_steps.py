"""Steps per agent run, counted as the run's spans arrive: the highest ``agenttape.step`` of each open run.

A run's inner spans usually arrive before its own (``invoke_agent``) span, often in earlier batches:
the highest step seen is remembered per run until the run span arrives, which takes it. When a batch
holds both a run's inner spans and its run span, the step is worked out with numpy and never stored,
so the Python work per batch grows with the runs left open or already remembered, not with every run.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_OPEN_RUNS = 100_000  # runs whose steps are counted while their run span has not arrived


class OpenRuns:
    """The highest step remembered per open run (by run id), oldest first."""

    def __init__(self) -> None:
        self.highest: dict[str, int] = {}

    def observe(self, run_id: pa.Array, step: pa.Array, is_run: np.ndarray) -> np.ndarray:
        """Remember the highest step of each run in a batch; return the steps of its run spans
        (``is_run`` rows, in order: 0 for a run with none, or one whose steps were taken already)."""
        runs = np.flatnonzero(is_run)
        inner = ~is_run
        if step.null_count:
            inner &= step.is_valid().to_numpy(zero_copy_only=False)
        if run_id.null_count:
            inner &= run_id.is_valid().to_numpy(zero_copy_only=False)
        if not len(runs) and not inner.any():
            return np.zeros(0, dtype=np.float64)
        enc = run_id.dictionary_encode()
        codes = enc.indices
        codes = (pc.fill_null(codes, -1) if codes.null_count else codes).to_numpy(zero_copy_only=False)
        codes = codes.astype(np.int64)
        ids = enc.dictionary.to_pylist()
        rows = np.flatnonzero(inner)
        present, highest = _highest(codes, rows, step, len(ids))
        if len(self.highest) + len(present) > MAX_OPEN_RUNS:  # remembering may evict: one by one
            return self._observe_each(codes, ids, runs, present, highest)
        run_codes = codes[runs]
        # the rows that take a run's step: the first run span of each named run (a later one gets 0)
        takers = np.full(len(ids), -1, dtype=np.int64)
        named = run_codes >= 0
        takers[run_codes[named][::-1]] = np.flatnonzero(named)[::-1]
        if "" in ids:  # an empty run id takes nothing
            takers[ids.index("")] = -1
        steps = np.zeros(len(runs), dtype=np.float64)
        remembered = self.highest
        taken = takers[present] >= 0
        # runs whose run span is in the batch: the step after remembering, taken at once
        both = present[taken]
        best = highest[both]
        if remembered and len(both):
            before = [remembered.pop(ids[c], None) for c in both.tolist()]
            best = np.array([s if b is None or s > b else b for s, b in zip(best.tolist(), before)], dtype=np.int64)
            seen = np.array([b is not None for b in before], dtype=bool)
        else:
            seen = np.zeros(len(both), dtype=bool)
        steps[takers[both]] = np.where(seen | (best > -1), best, 0)
        # runs still open: remembered in the order they appear
        for c, s in zip(present[~taken].tolist(), highest[present[~taken]].tolist()):
            r = ids[c]
            if s > remembered.get(r, -1):
                remembered[r] = s
        # run spans of runs without inner spans here: the step remembered from earlier batches
        if remembered:
            alone = np.flatnonzero(takers >= 0)
            alone = alone[np.isin(alone, present, invert=True)]
            if len(alone):
                steps[takers[alone]] = [remembered.pop(ids[c], 0) for c in alone.tolist()]
        return steps

    def _observe_each(self, codes: np.ndarray, ids: list, runs: np.ndarray, present: np.ndarray,
                      highest: np.ndarray) -> np.ndarray:
        """The same, one run at a time, for a batch that may push the oldest runs out."""
        remembered = self.highest
        rs, ss = [ids[c] for c in present.tolist()], highest[present].tolist()
        before = [remembered.get(r, -1) for r in rs]
        remembered.update((r, s) for r, s, b in zip(rs, ss, before) if s > b)
        excess = len(remembered) - MAX_OPEN_RUNS
        if excess > 0:
            for r in list(itertools.islice(remembered, excess)):
                del remembered[r]
        names = [ids[c] if c >= 0 else None for c in codes[runs].tolist()]
        return np.array([remembered.pop(r, 0) if r else 0 for r in names], dtype=np.float64)


def _highest(codes: np.ndarray, rows: np.ndarray, step: pa.Array, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The runs (codes) with steps among ``rows``, in the order they first appear, and the highest
    step of every run (the int64 minimum for the others)."""
    highest = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    if not len(rows):
        return np.zeros(0, dtype=np.int64), highest
    code = codes[rows]
    st = (pc.fill_null(step, 0) if step.null_count else step).to_numpy(zero_copy_only=False).astype(np.int64)
    np.maximum.at(highest, code, st[rows])
    first = np.full(n, len(codes), dtype=np.int64)
    first[code[::-1]] = rows[::-1]  # each run's first row among these
    present = np.flatnonzero(first < len(codes))
    return present[np.argsort(first[present], kind="stable")], highest
