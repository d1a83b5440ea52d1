"""``runs`` rows computed from some traces' or some runs' spans alone, never from the whole view: the
summaries of a page's runs, one run by ref, a trace's runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...store.run_keys import HAS_FOREIGN, NOT_CHECKPOINT, ours_parent_refs, ours_runs_select
from ...store.runs_view import runs_select
from ..load import Reader, _rows, _source

RUN_COLUMNS = (
    "run_id, trace_id, span_id, agent, session_id, parent_run_id, status, start_time_unix_nano, "
    "end_time_unix_nano, duration_ms, model_nodes, tool_nodes, tool_errors, input_tokens, output_tokens, "
    "service_name, status_message, ref, source, parent_ref, errors, tape_id, models, tools, incomplete"
)


# Above this many runs, the rows are taken from the whole ``runs`` view rather than trace by trace.
MAX_TRACES = 500


def _newest_first(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["start_time_unix_nano"], row["ref"])


def has_foreign(reader: Reader) -> bool:
    """Whether the store holds a span without a run id (another instrumentation's, or a bare trace's;
    not a tape checkpoint)."""
    return bool(_rows(reader, HAS_FOREIGN, [])[0]["f"])


def traces_rows(reader: Reader, trace_ids: Sequence[str], columns: str, where: str = "true",
                params: Sequence[Any] = (), windows: Mapping[str, tuple[int, int]] | None = None
                ) -> list[dict[str, Any]]:
    """``runs`` rows of these traces matching ``where``: agenttape runs by the small query, and only the
    traces that hold other spans through the whole one (unordered). ``windows`` (each trace's first start
    and last end, as ``tape.load.trace_windows`` gives them) bound the scan."""
    ids = sorted(set(trace_ids))
    if not ids:
        return []
    window = _window(ids, windows)
    marks = ", ".join("?" for _ in ids)
    foreign = [r["trace_id"] for r in _rows(
        reader, f"SELECT DISTINCT trace_id FROM spans WHERE {window}trace_id IN ({marks}) AND run_id IS NULL "
        f"AND {NOT_CHECKPOINT}", ids)]
    runs, run_params = in_traces(ids, theirs=False, window=window)
    rows = _rows(reader, f"SELECT {columns} FROM {runs} r WHERE {where}", [*run_params, *params])
    if foreign:
        runs, run_params = in_traces(foreign, ours=False, window=window)
        rows += _rows(reader, f"SELECT {columns} FROM {runs} r WHERE {where}", [*run_params, *params])
    return rows


def _window(ids: Sequence[str], windows: Mapping[str, tuple[int, int]] | None) -> str:
    """A bound on start times holding every span of these traces ('' when not known for all)."""
    if not windows or any(i not in windows for i in ids):
        return ""
    lo, hi = min(int(windows[i][0]) for i in ids), max(int(windows[i][1]) for i in ids)
    return f"start_time_unix_nano BETWEEN {lo} AND {hi} AND "


def summaries(reader: Reader, keys: list[dict[str, Any]], oldest_first: bool = False,
               linked: set[str] | None = None) -> list[dict[str, Any]]:
    """The ``runs`` rows of these keys (``run_keys_select`` rows), computed from their spans alone: an
    agenttape run from the spans with its run id in its trace, within the time its spans start in (so the
    scan skips the row groups outside it); another source's from its whole trace."""
    rows: list[dict[str, Any]] = []
    ours = [k for k in keys if k["ours"]]
    if ours:
        runs = sorted({k["ref"].rpartition("@")[0] for k in ours})
        traces = sorted({k["trace_id"] for k in ours})
        refs = sorted({k["ref"] for k in ours})
        lo, hi = min(k["span_lo"] for k in ours), max(k["span_hi"] for k in ours)
        spans = _source(reader, "spans", "trace_id", traces, (int(lo), int(hi)))  # an Iceberg lake: the newest files
        src = (f"(SELECT * FROM {spans} WHERE start_time_unix_nano BETWEEN {int(lo)} AND {int(hi)} "
               f"AND trace_id IN ({marks(traces)}) AND run_id IN ({marks(runs)}))")
        found = _rows(reader, f"SELECT {RUN_COLUMNS}, run_span FROM ({ours_runs_select(src)}) r "
                      f"WHERE ref IN ({marks(refs)})", [*traces, *runs, *refs])
        has_links = ours_parent_refs(found, lambda sql, params: _rows(reader, sql, params))
        if linked is not None:
            linked |= has_links
        for r in found:
            del r["run_span"]
        rows += found
    theirs = [k for k in keys if not k["ours"]]
    if theirs:
        refs = sorted({k["ref"] for k in theirs})
        sql, params = in_traces(sorted({k["trace_id"] for k in theirs}), ours=False)
        rows += _rows(reader, f"SELECT {RUN_COLUMNS} FROM {sql} r WHERE ref IN ({marks(refs)})", [*params, *refs])
    return sorted(rows, key=_newest_first, reverse=not oldest_first)


def marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def in_traces(trace_ids: Sequence[str], *, ours: bool = True, theirs: bool = True,
              window: str = "") -> tuple[str, list[str]]:
    """``runs`` computed from these traces' spans only: one run read without listing the store."""
    marks = ", ".join("?" for _ in trace_ids)
    src = f"(SELECT * FROM spans WHERE {window}trace_id IN ({marks}))"
    return f"({runs_select(src, ours=ours, theirs=theirs)})", list(trace_ids)
