"""The chain check done at ingest: does each sealed span's link follow from the link before it?

Kept apart from the metrics it feeds (``agenttape_chain_*``): it remembers the last link of each
recent tape between batches, so a tape cut across two batches is still checked where they meet.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from otel_agenttape.receiver.metric_state import new_runs
from otel_agenttape.receiver.span_labels import flat, true_mask

MAX_CHAINS = 50_000  # tapes whose last link is remembered to check the next one


class ChainLinks:
    """The last link (seq, hash) remembered per tape (chain id, epoch), oldest first."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int], tuple[int, str]] = {}

    def check(self, t: pa.Table) -> tuple[int, int, int]:
        """Each sealed span's ``chain_prev`` must be the ``chain_hash`` of the span before it in its tape.
        Checked within the batch and against the last link remembered per tape; a link whose predecessor
        is not known (a first link, out of order, evicted) is left to ``agenttape verify``."""
        cid = flat(t.column("chain_id"))
        group = cid.dictionary_encode().indices.to_numpy(zero_copy_only=False).astype(np.int64)
        epoch = pc.fill_null(t.column("chain_epoch"), 0).to_numpy().astype(np.int64)
        seq = pc.fill_null(t.column("chain_seq"), -1).to_numpy().astype(np.int64)
        if not _in_order(group, epoch, seq):  # usually they arrive in order already
            order = np.lexsort((seq, epoch, group))
            take = pa.array(order)
            group, epoch, seq, cid = group[order], epoch[order], seq[order], cid.take(take)
            prev, hsh = flat(t.column("chain_prev")).take(take), flat(t.column("chain_hash")).take(take)
        else:
            prev, hsh = flat(t.column("chain_prev")), flat(t.column("chain_hash"))
        n = len(seq)
        checked = prev_bad = reused_bad = 0
        if n > 1:  # each link against the one before it in the batch
            same = (group[1:] == group[:-1]) & (epoch[1:] == epoch[:-1])
            follows = same & (seq[1:] == seq[:-1] + 1)
            reused = same & (seq[1:] == seq[:-1])
            checked += int(follows.sum() + reused.sum())
            prev_bad += int((follows & true_mask(pc.not_equal(prev.slice(1), hsh.slice(0, n - 1)))).sum())
            if reused.any():
                reused_bad += int((reused & true_mask(pc.not_equal(hsh.slice(1), hsh.slice(0, n - 1)))).sum())
        starts = np.flatnonzero(new_runs(group) | new_runs(epoch))
        ends = np.append(starts[1:] - 1, n - 1)
        keys = list(zip(cid.take(pa.array(starts)).to_pylist(), epoch[starts].tolist()))
        chains = self.last
        known = list(map(chains.get, keys))
        fresh = known.count(None) == len(known)  # no tape of the batch was seen before
        if not fresh:  # first links of the batch against the remembered ones
            first_prev = prev.take(pa.array(starts)).to_pylist()
            first_hash = hsh.take(pa.array(starts)).to_pylist()
            for j, k in enumerate(known):
                if k is None:
                    continue
                s0 = int(seq[starts[j]])
                if s0 == k[0] + 1:
                    checked += 1
                    prev_bad += first_prev[j] != k[1]
                elif s0 == k[0]:
                    checked += 1
                    reused_bad += first_hash[j] != k[1]
        last = zip(seq[ends].tolist(), hsh.take(pa.array(ends)).to_pylist())
        if fresh:
            chains.update(zip(keys, last))
        else:
            chains.update((key, link) for key, link, k in zip(keys, last, known) if k is None or link[0] >= k[0])
        excess = len(chains) - MAX_CHAINS
        if excess > 0:
            for key in list(itertools.islice(chains, excess)):
                del chains[key]
        return checked, prev_bad, reused_bad


def _in_order(group: np.ndarray, epoch: np.ndarray, seq: np.ndarray) -> bool:
    """Whether the rows are sorted by (group, epoch, seq) already (then a stable sort keeps them as
    they are, and sorting can be skipped)."""
    if len(seq) < 2:
        return True
    g0, g1, e0, e1, s0, s1 = group[:-1], group[1:], epoch[:-1], epoch[1:], seq[:-1], seq[1:]
    return bool(((g1 > g0) | ((g1 == g0) & ((e1 > e0) | ((e1 == e0) & (s1 >= s0))))).all())
