"""Which keys a store may already hold, in 4 bytes per stored row (see ``writer.py``)."""

from __future__ import annotations

import duckdb
import numpy as np


class KeyFilter:
    """A 32-bit fingerprint of every stored row's key (the upper half of DuckDB's ``hash(key)``), in a
    few sorted arrays: "surely new" or "maybe stored".

    4 bytes per stored key: the filter stays in memory for as long as the store is open, so it is what
    a receiver's memory grows by with its store. Two keys share a fingerprint only by chance: a new key
    is then checked exactly (``writer.py``), which happens for n / 2**32 of the new keys when n are stored
    (0.23% at 10,000,000). Lookups are binary searches (cost grows with log n); new keys go in a small
    sorted run that is merged with the runs no larger than twice its size (timsort merges sorted runs in
    linear time), so each key is merged O(log n) times. Built from the table when the store opens.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, table: str, key_sql: str) -> None:
        self.table = table
        self.key_sql = key_sql
        self._runs: list[np.ndarray] = []
        self._rebuild(con)

    @property
    def count(self) -> int:
        return sum(len(r) for r in self._runs)

    @property
    def nbytes(self) -> int:
        """Memory the filter holds (4 bytes per stored key)."""
        return sum(r.nbytes for r in self._runs)

    def _rebuild(self, con: duckdb.DuckDBPyConnection) -> None:
        t = con.sql(f"SELECT (hash({self.key_sql}) >> 32)::UINTEGER FROM {self.table}").to_arrow_table()
        keys = t.column(0).to_numpy() if t.num_rows else np.empty(0, dtype=np.uint32)
        self._runs = [np.sort(keys.astype(np.uint32, copy=False))] if len(keys) else []

    def maybe_stored(self, hashes: np.ndarray) -> np.ndarray:
        """Boolean mask over ``hash(key)`` values: True where the key may be stored (check exactly),
        False where it surely is not."""
        prints = fingerprints(hashes)
        hit = np.zeros(len(prints), dtype=bool)
        for run in self._runs:
            i = np.searchsorted(run, prints)
            np.minimum(i, len(run) - 1, out=i)
            hit |= run[i] == prints
        return hit

    def added(self, con: duckdb.DuckDBPyConnection, hashes: np.ndarray) -> None:
        """Record the keys (their ``hash(key)`` values) of rows just inserted."""
        if not len(hashes):
            return
        new = np.sort(fingerprints(hashes))
        while self._runs and len(self._runs[-1]) <= 2 * len(new):
            new = np.sort(np.concatenate((self._runs.pop(), new)), kind="stable")
        self._runs.append(new)


def fingerprints(hashes: np.ndarray) -> np.ndarray:
    """The upper 32 bits of 64-bit ``hash(key)`` values, as the filter keeps them."""
    return (np.asarray(hashes).astype(np.uint64, copy=False) >> np.uint64(32)).astype(np.uint32)
