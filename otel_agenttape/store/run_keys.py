"""The runs' keys and agenttape runs alone, in SQL: what a page of runs is ordered, filtered and counted
by before any run is summarised, and the flat query a page's agenttape runs are summarised by. Both give
the values of the ``runs`` view (``store/runs_view.py``), from promoted columns only."""

from __future__ import annotations

from otel_agenttape import semconv as sc
from otel_agenttape.store.runs_view import OURS_ROLE, RUNS_SQL, RUN_OPS_SQL, ours_roles_select, runs_select

# --- the runs' keys, cheaply: what a page is ordered and filtered by, before any run is summarised ---

_T = "start_time_unix_nano"
# Per agenttape run (run id, trace), the runs view's columns that filters read, by the view's rules.
OURS_KEY_COLUMNS = {
    "start_time_unix_nano": f"coalesce(min({_T}) FILTER (WHERE r = 'run'), min({_T}))",
    "agent": (f"coalesce(arg_min(agent_name, {_T}) FILTER (WHERE r = 'run' AND agent_name IS NOT NULL), "
              f"arg_min(agent_name, {_T}) FILTER (WHERE agent_name IS NOT NULL))"),
    "status": (f"coalesce(arg_max(run_status, {_T}) FILTER (WHERE r = 'run' AND run_status IS NOT NULL), "
               "CASE WHEN count(*) FILTER (WHERE r = 'run') = 0 THEN 'incomplete' "
               f"WHEN coalesce(bool_or(status_code = 2) FILTER (WHERE r = 'run'), false) THEN '{sc.STATUS_ERROR}' "
               f"ELSE '{sc.STATUS_COMPLETED}' END)"),
    "source": f"'{sc.SOURCE_AGENTTAPE}'",
    "session_id": (f"coalesce(arg_min(session_id, {_T}) FILTER (WHERE r = 'run'), "
                   f"arg_min(session_id, {_T}) FILTER (WHERE session_id IS NOT NULL))"),
    "service_name": (f"coalesce(arg_min(service_name, {_T}) FILTER (WHERE r = 'run'), "
                     f"arg_min(service_name, {_T}))"),
    "status_message": f"arg_max(status_message, {_T}) FILTER (WHERE r = 'run' AND status_message IS NOT NULL)",
    # an agenttape run's models and tools are asked of its spans (ours_has), not listed for every run
    "models": "CAST(NULL AS VARCHAR[])",
    "tools": "CAST(NULL AS VARCHAR[])",
    # the run's spans start in [span_lo, span_hi]: a bound that prunes row groups when it is summarised
    "span_lo": f"min({_T})",
    "span_hi": f"max({_T})",
}
_UNBOUNDED = ("span_lo", "span_hi")
_SPAN_COLUMNS = ("run_id, trace_id, start_time_unix_nano, node_type, operation_name, agent_name, run_status, "
                 "status_code, session_id, service_name, status_message")
# A span without a run id that is not another instrumentation's: the tape checkpoints capture exports
# (never a run, a model call or a tool call), erasure records, and the ``agenttape.score`` spans of a
# score's own tape (a score names a run; it is not one), so a sealed store is not read as holding
# foreign runs.
NOT_CHECKPOINT = (f"NOT ((name IN ('{sc.EVENT_CHECKPOINT}', '{sc.EVENT_ERASURE}') "
                  f"AND scope_name IS NOT DISTINCT FROM '{sc.SCOPE_INTEGRITY}') "
                  f"OR (name = '{sc.SCORE_SPAN_NAME}' AND scope_name IS NOT DISTINCT FROM '{sc.SCOPE_NAME}'))")
FOREIGN_SPANS = ("(SELECT * FROM spans WHERE trace_id IN "
                 f"(SELECT trace_id FROM spans WHERE run_id IS NULL AND {NOT_CHECKPOINT}))")


def run_keys_select(columns: list[str], foreign: bool = True, narrow: str = "", runs: str = "") -> str:
    """One row per run of the store: ``run_id``, ``trace_id``, ``ref``, ``ours`` and ``columns`` (of
    ``OURS_KEY_COLUMNS``), with the runs view's values. Agenttape runs come from promoted columns in one
    aggregate; only traces holding a span without a run id (other instrumentations') are summarised
    whole, and not at all with ``foreign=False`` (for a store that has no such span). ``narrow``: a
    condition on spans that every selected agenttape run has a span meeting (its agent, session or
    service name), so that only those runs are aggregated. ``runs``: a condition on spans that picks
    whole agenttape runs (``run_id IN (...)``), the only ones listed."""
    ours = ", ".join(f"{OURS_KEY_COLUMNS[c]} AS {c}" for c in columns)
    keys = f"""
SELECT run_id, trace_id, run_id || '@' || trace_id AS ref, true AS ours, {ours}
FROM (SELECT {_SPAN_COLUMNS}, {OURS_ROLE} AS r FROM spans WHERE run_id IS NOT NULL)
GROUP BY run_id, trace_id"""
    if runs:
        keys = keys.replace("FROM spans WHERE run_id IS NOT NULL)", f"FROM spans WHERE run_id IS NOT NULL AND {runs})", 1)
    if narrow:
        keys = keys.replace(
            "FROM spans WHERE run_id IS NOT NULL)",
            "FROM spans s SEMI JOIN (SELECT DISTINCT run_id AS n_run, trace_id AS n_trace FROM spans "
            f"WHERE run_id IS NOT NULL AND {narrow}) n ON n.n_run = s.run_id AND n.n_trace = s.trace_id "
            "WHERE run_id IS NOT NULL)", 1)
    if foreign:
        theirs = ", ".join(f"CAST(NULL AS BIGINT) AS {c}" if c in _UNBOUNDED else c for c in columns)
        keys += f"""
UNION ALL
SELECT run_id, trace_id, ref, false AS ours, {theirs}
FROM ({runs_select(FOREIGN_SPANS, ours=False)})"""
    return f"({keys})"


HAS_FOREIGN = f"SELECT EXISTS (SELECT 1 FROM spans WHERE run_id IS NULL AND {NOT_CHECKPOINT}) AS f"


def ours_has(column: str, role: str, c: str = "c") -> str:
    """SQL true when the agenttape run ``c`` has a ``role`` span whose ``column`` (model | tool_name) is
    the next parameter, as the view's ``models``/``tools`` lists say."""
    value = "coalesce(m.response_model, m.request_model)" if column == "model" else "m.tool_name"
    return (f"EXISTS (SELECT 1 FROM spans m WHERE m.run_id = {c}.run_id AND m.trace_id = {c}.trace_id "
            f"AND ({OURS_ROLE.replace('node_type', 'm.node_type').replace('operation_name', 'm.operation_name')})"
            f" = '{role}' AND {value} = ?)")


# --- agenttape runs alone, as a flat query: what a page of them is summarised by ---

_OURS_AGG = RUNS_SQL.split("ours AS (", 1)[1].split("\n),\nft AS MATERIALIZED (", 1)[0].replace("@OURS_ONLY@", "")
_FINAL = "SELECT\n  b.key AS run_id" + RUNS_SQL.split("\nSELECT\n  b.key AS run_id", 1)[1].split("\nFROM base b", 1)[0]
assert _FINAL.count("p.parent_trace") == 1 and _FINAL.count("lk.link_ref") == 2
_FINAL = _FINAL.replace("p.parent_trace", "CAST(NULL AS VARCHAR)").replace("lk.link_ref", "CAST(NULL AS VARCHAR)")


def ours_runs_select(src: str) -> str:
    """The ``runs`` rows of the agenttape runs in ``src`` (every span of each run there), plus ``run_span``
    (the run's first run span, None for an incomplete run) — without the parent and link lookups, which
    the view makes over the whole store: here ``parent_ref`` is ``parent_run_id@trace_id`` and a run
    without a parent run id has none. ``ours_parent_refs`` finishes both from two small queries' rows.

    The same aggregate and the same output expressions as ``runs_select`` (cut from its text), in a query
    small enough that DuckDB plans it in a few milliseconds (the view's plan takes about 60 ms)."""
    return (f"WITH sr AS ({ours_roles_select(src)}), ours AS ({_OURS_AGG}), "
            "base AS (SELECT *, CAST(NULL AS VARCHAR) AS parent_key FROM ours)\n"
            f"{_FINAL}, b.run_span AS run_span\nFROM base b")


# The start of every (run id, trace) that holds a parent run id: the view's ``keys``.
PARENT_KEYS = ("SELECT run_id AS key, trace_id, min(start_time_unix_nano) AS start_ns FROM spans "
               "WHERE run_id IN ({marks}) GROUP BY run_id, trace_id")
# The links of run spans that are not a session's next turn: the view's ``links``.
RUN_SPAN_LINKS = (
    "SELECT trace_id, span_id, link_index, linked_trace_id, linked_span_id FROM span_links "
    "WHERE trace_id IN ({traces}) AND span_id IN ({spans}) "
    f"AND (attributes->'$.\"{sc.PREVIOUS_RUN_ID}\"') IS NULL")
# The linked spans that are runs (ours, or another instrumentation's run operation): the view's ``linked``.
LINKED_RUN_SPANS = (
    "SELECT trace_id, span_id, coalesce(run_id, span_id) AS run FROM spans WHERE trace_id IN ({traces}) "
    f"AND span_id IN ({{spans}}) AND (run_id IS NOT NULL OR operation_name IN ({RUN_OPS_SQL}))")


def ours_parent_refs(rows: list[dict], query) -> set[str]:
    """Finish ``ours_runs_select`` rows in place as the view has them: ``parent_ref`` of a run with a parent
    run id names that run in the trace the view picks (the same trace, else one that started before it,
    else the latest); a run without one takes its run span's first link to a run as its parent.
    ``query(sql, params)`` returns a list of dicts. Returns the refs whose run span has links (their
    parent can change as the linked spans arrive)."""
    parented = [r for r in rows if r["parent_run_id"] is not None]
    if parented:
        ids = sorted({r["parent_run_id"] for r in parented})
        found: dict[str, list[tuple[str, int]]] = {}
        for k in query(PARENT_KEYS.format(marks=", ".join("?" for _ in ids)), ids):
            found.setdefault(k["key"], []).append((k["trace_id"], int(k["start_ns"])))
        for r in parented:
            cands = found.get(r["parent_run_id"])
            if cands:
                start = int(r["start_time_unix_nano"])
                trace = max(cands, key=lambda c: (c[0] == r["trace_id"], c[1] <= start, c[1]))[0]
                r["parent_ref"] = f"{r['parent_run_id']}@{trace}"
    linking = [r for r in rows if r["parent_run_id"] is None and r["run_span"] is not None]
    if not linking:
        return set()
    traces = sorted({r["trace_id"] for r in linking})
    spans = sorted({r["run_span"] for r in linking})
    wanted = {(r["trace_id"], r["run_span"]) for r in linking}
    links = [l for l in query(RUN_SPAN_LINKS.format(traces=", ".join("?" for _ in traces),
                                                     spans=", ".join("?" for _ in spans)), [*traces, *spans])
             if (l["trace_id"], l["span_id"]) in wanted]
    if not links:
        return set()
    linked = {(l["trace_id"], l["span_id"]) for l in links}
    ltraces = sorted({l["linked_trace_id"] for l in links})
    lspans = sorted({l["linked_span_id"] for l in links})
    runs = {(t["trace_id"], t["span_id"]): t["run"] for t in query(
        LINKED_RUN_SPANS.format(traces=", ".join("?" for _ in ltraces), spans=", ".join("?" for _ in lspans)),
        [*ltraces, *lspans])}
    first: dict[tuple[str, str], tuple[int, str]] = {}
    for l in links:
        run = runs.get((l["linked_trace_id"], l["linked_span_id"]))
        if run is None:
            continue
        ref = f"{run}@{l['linked_trace_id']}"
        key = (l["trace_id"], l["span_id"])
        if key not in first or (int(l["link_index"]), ref) < first[key]:
            first[key] = (int(l["link_index"]), ref)
    for r in linking:
        hit = first.get((r["trace_id"], r["run_span"]))
        if hit is not None:
            r["parent_ref"] = hit[1]
            r["parent_run_id"] = hit[1].split("@", 1)[0]
    return {r["ref"] for r in linking if (r["trace_id"], r["run_span"]) in linked}
