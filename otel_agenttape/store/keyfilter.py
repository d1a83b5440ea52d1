"""Which keys a store may already hold, in 8 bytes per stored row (see ``writer.py``)."""

from __future__ import annotations

import duckdb
import numpy as np


class KeyFilter:
    """The 64-bit ``hash(key)`` of every stored row, in a few sorted arrays: "surely new" or "maybe stored".

    8 bytes per stored key. Lookups are binary searches (cost grows with log n); new keys go in a
    small sorted run that is merged with the runs no larger than twice its size (timsort merges sorted
    runs in linear time), so each key is merged O(log n) times. Built from the table when the store opens.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, table: str, key_sql: str) -> None:
        self.table = table
        self.key_sql = key_sql
        self._runs: list[np.ndarray] = []
        self._rebuild(con)

    @property
    def count(self) -> int:
        return sum(len(r) for r in self._runs)

    def _rebuild(self, con: duckdb.DuckDBPyConnection) -> None:
        t = con.sql(f"SELECT hash({self.key_sql}) FROM {self.table}").to_arrow_table()
        keys = t.column(0).to_numpy() if t.num_rows else np.empty(0, dtype=np.uint64)
        self._runs = [np.sort(keys.astype(np.uint64, copy=False))] if len(keys) else []

    def maybe_stored(self, hashes: np.ndarray) -> np.ndarray:
        """Boolean mask: True where the key may be stored (check exactly), False where it surely is not."""
        hit = np.zeros(len(hashes), dtype=bool)
        for run in self._runs:
            i = np.searchsorted(run, hashes)
            np.minimum(i, len(run) - 1, out=i)
            hit |= run[i] == hashes
        return hit

    def added(self, con: duckdb.DuckDBPyConnection, hashes: np.ndarray) -> None:
        """Record the keys of rows just inserted."""
        if not len(hashes):
            return
        new = np.sort(hashes.astype(np.uint64, copy=False))
        while self._runs and len(self._runs[-1]) <= 2 * len(new):
            new = np.sort(np.concatenate((self._runs.pop(), new)), kind="stable")
        self._runs.append(new)
