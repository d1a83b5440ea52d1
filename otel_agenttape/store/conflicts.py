"""Re-sent spans whose content differs from the first copy: conflicts, not duplicates.

The writer compares re-sent spans with the stored ones in SQL (``Store._count_conflicts``); this
compares the copies that arrive in one batch, before any is stored. Repeats are rare, so the rows
compared are turned into Python values."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def _keys(t: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(t.column("trace_id"), t.column("span_id"), "/")


def count_differing(kept: pa.Table, repeats: pa.Table) -> tuple[int, str | None]:
    """How many rows of ``repeats`` differ from the row of ``kept`` with the same (trace id, span id),
    and the ``trace_id/span_id`` of one of them."""
    if not repeats.num_rows:
        return 0, None
    repeat_keys = _keys(repeats)
    first = kept.filter(pc.is_in(_keys(kept), repeat_keys))
    by_key: dict[Any, dict[str, Any]] = dict(zip(_keys(first).to_pylist(), first.to_pylist()))
    n, example = 0, None
    for key, row in zip(repeat_keys.to_pylist(), repeats.to_pylist()):
        if by_key.get(key, row) != row:
            n += 1
            example = example or key
    return n, example
