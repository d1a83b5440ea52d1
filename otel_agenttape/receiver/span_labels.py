"""The label columns of one stored batch of spans, capped and grouped once for every span metric.

Each label becomes integer codes over the whole batch the first time a metric needs it (``LabelCap``
sees the column's values in the order they first appear, as it always has), and each tuple of labels
becomes the batch's label sets once (``Groups``): the metrics that share labels share them, and a
tuple inside one already grouped is derived from it without touching the rows again.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from otel_agenttape.receiver.metric_state import Codes, Groups, LabelCap

# label -> the spans column it is read from (the others are derived: status, error_type, legacy_model)
COLUMN = {"gen_ai_operation_name": "operation_name", "gen_ai_provider_name": "provider_name",
          "gen_ai_request_model": "request_model", "gen_ai_response_model": "response_model",
          "gen_ai_agent_name": "agent_name", "gen_ai_tool_name": "tool_name", "service_name": "service_name"}


class BatchLabels:
    """Capped label codes and label sets of one batch, each computed at most once."""

    def __init__(self, caps: dict[str, LabelCap], spans: pa.Table, err: pa.Array,
                 encoded: dict[str, pa.DictionaryArray] | None = None) -> None:
        self.caps, self.spans, self.err = caps, spans, err
        self.encoded = encoded or {}  # columns dictionary-encoded already (for masks), by column name
        self._full: dict[str, Codes] = {}
        self._groups: dict[tuple[str, ...], Groups] = {}

    def column(self, name: str) -> Codes:
        """The capped codes of label ``name`` for every row of the batch."""
        col = self._full.get(name)
        if col is None:
            if name == "status":
                col = run_status_codes(self.caps[name], self.spans, self.err)
            elif name == "error_type":
                col = self.caps[name].codes(error_types(self.spans, self.err))
            elif name == "legacy_model":  # the response model, else the requested one
                col = self.caps["gen_ai_response_model"].codes(
                    pc.coalesce(self.spans.column("response_model"), self.spans.column("request_model")))
            else:
                column = COLUMN[name]
                enc = self.encoded.get(column)
                col = self.caps[name].codes(self.spans.column(column) if enc is None else enc)
            self._full[name] = col
        return col

    def groups(self, names: tuple[str, ...]) -> Groups:
        """The label sets of ``names`` over the batch: derived from the sets of a tuple that holds
        them all when there is one (no new label column is read then), else grouped from the rows."""
        got = self._groups.get(names)
        if got is None:
            if len(names) == 1 and names[0] in self._full:
                got = Groups.of([self._full[names[0]]])
            else:
                for have, sets in self._groups.items():
                    if len(have) > 1 and set(names) <= set(have):
                        got = sets.project([have.index(n) for n in names])
                        break
                else:
                    got = Groups.of([self.column(n) for n in names])
            self._groups[names] = got
        return got


def run_status(spans: pa.Table, err: pa.Array) -> pa.Array:
    """A run's status: its ``agenttape.run.status``, else "error" when the span failed, else "completed"."""
    status = flat(spans.column("run_status"))
    fallback = pc.if_else(err, "error", "completed")
    return pc.coalesce(status, fallback)


def run_status_codes(cap: LabelCap, spans: pa.Table, err: pa.Array) -> Codes:
    """``cap.codes(run_status(spans, err))`` without building the strings of every row: the status
    column (mostly null) is encoded, the fallback becomes two more codes, and the values are put in
    the order they first appear, as encoding the whole column would."""
    status = flat(spans.column("run_status"))
    if not pa.types.is_string(status.type):
        return cap.codes(run_status(spans, err))
    enc = status.dictionary_encode()
    values = enc.dictionary.to_pylist()
    codes = enc.indices
    codes = (pc.fill_null(codes, -1) if codes.null_count else codes).to_numpy(zero_copy_only=False)
    codes = codes.astype(np.int64)
    missing = codes < 0
    if missing.any():
        where = {v: i for i, v in enumerate(values)}
        for v in ("error", "completed"):
            if v not in where:
                where[v] = len(values)
                values.append(v)
        codes[missing] = np.where(true_mask(err)[missing], where["error"], where["completed"])
    n = len(codes)
    first = np.full(len(values), n, dtype=np.int64)
    first[codes[::-1]] = np.arange(n - 1, -1, -1, dtype=np.int64)  # each value's first row
    present = np.flatnonzero(first < n)
    order = present[np.argsort(first[present], kind="stable")]
    renumber = np.zeros(len(values), dtype=np.int64)
    renumber[order] = np.arange(len(order), dtype=np.int64)
    return cap.encoded([values[i] for i in order.tolist()], renumber[codes])


_ERROR_TYPE = r'"error\.type":\{"s":"(?P<t>(?:[^"\\]|\\.)*)"'


def error_types(spans: pa.Table, err: pa.Array) -> pa.Array:
    """``error.type`` of failed spans (``_OTHER`` when a failed span names none), null elsewhere.
    Read with one regular expression over the typed-JSON attributes of the failed spans only."""
    out = pa.nulls(spans.num_rows, pa.string())
    idx = np.flatnonzero(true_mask(err))
    if not len(idx):
        return out
    attrs = flat(spans.column("attributes"))
    if isinstance(attrs, pa.ExtensionArray):  # JSON: its string storage takes rows twice as fast
        attrs = attrs.storage
    attrs = attrs.take(idx)
    if not pa.types.is_string(attrs.type):
        attrs = attrs.cast(pa.string())
    named = rows_containing(attrs, b'"error.type":')  # the pattern runs only where it can match
    found = pa.nulls(len(attrs), pa.string())
    if len(named):
        hits = pc.struct_field(pc.extract_regex(attrs.take(pa.array(named)), _ERROR_TYPE), [0])
        where = np.full(len(attrs), -1, dtype=np.int64)
        where[named] = np.arange(len(named))
        found = hits.take(pa.array(where, mask=where < 0))
    found = pc.if_else(pc.equal(pc.fill_null(found, ""), ""), "_OTHER", found)
    full = np.full(spans.num_rows, -1, dtype=np.int64)
    full[idx] = np.arange(len(idx))
    take = pa.array(full, mask=full < 0)
    return found.take(take)


def rows_containing(strings: pa.Array, needle: bytes) -> np.ndarray:
    """Indices of the strings that contain ``needle``: one scan over the array's data buffer in place
    (several times faster than ``pc.match_substring`` on long JSON, and no copy of a column that can
    be a hundred MB in a large batch), rows from the offsets. Null rows never match."""
    if isinstance(strings, pa.ExtensionArray):
        strings = strings.storage
    offsets_buf, data_buf = strings.buffers()[1:3]
    if data_buf is None or not len(strings):
        return np.zeros(0, dtype=np.int64)
    width = 8 if pa.types.is_large_string(strings.type) or pa.types.is_large_binary(strings.type) else 4
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if width == 8 else np.int32, count=len(strings) + 1,
                            offset=strings.offset * width)
    data = memoryview(data_buf)
    lo, hi = int(offsets[0]), int(offsets[-1])
    pattern = re.compile(re.escape(needle))
    found = []
    m = pattern.search(data, lo, hi)
    while m is not None:
        at = m.start()
        row = int(np.searchsorted(offsets, at, side="right")) - 1
        if at + len(needle) <= offsets[row + 1]:  # the match lies inside that string
            found.append(row)
            m = pattern.search(data, int(offsets[row + 1]), hi)  # next row
        else:
            m = pattern.search(data, at + 1, hi)
    rows = np.asarray(found, dtype=np.int64)
    if strings.null_count and len(rows):
        rows = rows[strings.is_valid().to_numpy(zero_copy_only=False)[rows]]
    return rows


def flat(column: Any) -> pa.Array:
    """One array of a column (its only chunk as it is: ``combine_chunks`` would copy it)."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def true_mask(mask: Any) -> np.ndarray:
    """A boolean numpy mask from an Arrow boolean array (null counts as false)."""
    mask = flat(mask)
    if mask.null_count:
        mask = pc.fill_null(mask, False)
    return mask.to_numpy(zero_copy_only=False)


def seconds(end: Any, start: Any) -> np.ndarray:
    diff = flat(pc.subtract(end, start))
    if diff.null_count:
        diff = pc.fill_null(diff, 0)
    return diff.to_numpy(zero_copy_only=False).astype(np.float64) / 1e9
