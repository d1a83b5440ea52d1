"""Cost at read time: the model calls of some runs (provider, model, tokens, time) read from their spans and
priced by ``otel_agenttape.pricing`` (genai-prices plus the user's overrides).

Nothing is stored: a price correction (a newer genai-prices, an override file) applies to old runs. A run's
cost sums its own model calls; a tree's sums each run of the tree once; a session's its turns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from ... import semconv as sc
from ...pricing import Cost, Prices
from ...store.runs_view import OURS_ROLE, json_paths, roles_select
from ..load import Reader, _rows, _source
from ..model import Node, Run

_CACHE_READ_KEYS = [sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS_LEGACY,
                    sc.OI_TOKEN_CACHE_READ]
_CACHE_WRITE_KEYS = [sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS, sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
                     sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS_LEGACY, sc.OI_TOKEN_CACHE_WRITE]
_PROVIDER_KEYS = [sc.OI_LLM_PROVIDER, sc.OI_LLM_SYSTEM]


def _extras(attrs: str, provider: str) -> tuple[str, str]:
    """(the JSON list ``c`` of the cache and provider attributes of ``attrs``, the columns read from it:
    ``cache_read_tokens``, ``cache_write_tokens`` and ``provider_any``, ``provider`` or the attributes)."""
    keys = _CACHE_READ_KEYS + _CACHE_WRITE_KEYS + _PROVIDER_KEYS
    c_list = f"json_extract({attrs}, {json_paths(keys)})"
    n_read, n_write = len(_CACHE_READ_KEYS), len(_CACHE_WRITE_KEYS)
    read = ", ".join(f"TRY_CAST(coalesce(c[{i + 1}]->>'i', c[{i + 1}]->>'s') AS BIGINT)" for i in range(n_read))
    write = ", ".join(f"TRY_CAST(coalesce(c[{n_read + i + 1}]->>'i', c[{n_read + i + 1}]->>'s') AS BIGINT)"
                      for i in range(n_write))
    prov = ", ".join(f"(c[{n_read + n_write + i + 1}]->>'s')" for i in range(len(_PROVIDER_KEYS)))
    cols = (f"coalesce({read}) AS cache_read_tokens, coalesce({write}) AS cache_write_tokens, "
            f"coalesce({provider}, {prov}) AS provider_any")
    return c_list, cols


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def ours_calls(reader: Reader, refs: Sequence[str] | None, lo: int | None = None, hi: int | None = None
               ) -> list[dict[str, Any]]:
    """The model calls of agenttape runs (``RUN_ID@TRACE_ID``; None: every run), one row each with its ``ref``."""
    if refs is not None and not refs:
        return []
    window = ""
    if lo is not None:
        window = f"start_time_unix_nano >= {int(lo)} AND "
    if hi is not None:
        window += f"start_time_unix_nano <= {int(hi)} AND "
    c_list, cols = _extras("attributes", "provider_name")
    params: list[Any] = []
    where = f"{window}run_id IS NOT NULL"
    spans = "spans"
    if refs is not None:
        runs = sorted({r.rpartition("@")[0] for r in refs})
        traces = sorted({r.rpartition("@")[2] for r in refs})
        where = f"{window}trace_id IN ({_marks(traces)}) AND run_id IN ({_marks(runs)})"
        params = [*traces, *runs]
        # over an Iceberg lake only the files of these traces within the window are read
        spans = _source(reader, "spans", "trace_id", traces, (lo, hi) if lo is not None or hi is not None else None)
    sql = (f"SELECT run_id || '@' || trace_id AS ref, trace_id, span_id, agent_name AS agent, "
           f"provider_name AS provider, coalesce(response_model, request_model) AS model, input_tokens, "
           f"output_tokens, start_time_unix_nano AS start_ns, {cols} "
           f"FROM (SELECT *, {c_list} AS c FROM {spans} WHERE {where} AND ({OURS_ROLE}) = 'model')")
    found = [_tidy(r) for r in _rows(reader, sql, params)]
    if refs is None:
        return found
    wanted = set(refs)
    return [r for r in found if r["ref"] in wanted]


def foreign_calls(reader: Reader, trace_ids: Sequence[str] | None) -> list[dict[str, Any]]:
    """The model calls of other instrumentations' runs in these traces (None: every trace), each under
    the run span that owns it (up to the next run span, as the ``runs`` view counts them) or, with no
    run span, its trace."""
    if trace_ids is not None and not trace_ids:
        return []
    in_traces = "TRUE" if trace_ids is None else f"trace_id IN ({_marks(trace_ids)})"
    src = f"(SELECT * FROM spans WHERE {in_traces})"
    c_list, cols = _extras("s.attributes", "s.provider_name")
    sql = f"""
WITH RECURSIVE sr AS MATERIALIZED ({roles_select(src)}),
down(trace_id, span_id, owner) AS (
  SELECT trace_id, span_id, span_id FROM sr WHERE role = 'run' AND run_id IS NULL
  UNION
  SELECT c.trace_id, c.span_id, d.owner FROM down d JOIN sr c ON c.trace_id = d.trace_id
    AND c.parent_span_id = d.span_id WHERE c.role <> 'run' AND c.run_id IS NULL
),
owners AS (SELECT trace_id, span_id, any_value(owner) AS owner FROM down GROUP BY trace_id, span_id),
m AS (
  SELECT coalesce(w.owner, x.trace_id) || '@' || x.trace_id AS ref, x.trace_id, x.span_id, x.model,
    x.input_tokens, x.output_tokens, x.start_time_unix_nano AS start_ns
  FROM sr x LEFT JOIN owners w ON w.trace_id = x.trace_id AND w.span_id = x.span_id
  WHERE x.role = 'model' AND x.run_id IS NULL
)
SELECT m.ref, m.trace_id, m.span_id, s.agent_name AS agent, m.model, m.input_tokens, m.output_tokens, m.start_ns,
  {cols}
FROM m JOIN (SELECT *, {c_list} AS c FROM spans s WHERE {in_traces.replace("trace_id", "s.trace_id")}) s
  ON s.trace_id = m.trace_id AND s.span_id = m.span_id
"""
    params = [] if trace_ids is None else [*trace_ids, *trace_ids]
    return [_tidy(r) for r in _rows(reader, sql, params)]


def _tidy(row: dict[str, Any]) -> dict[str, Any]:
    row["provider"] = row.pop("provider_any", None) or row.get("provider")
    return row


def calls_of_runs(reader: Reader, runs: Iterable[Any]) -> dict[str, list[dict[str, Any]]]:
    """The model calls of these runs (``RunSummary``-like: ``ref``, ``source``, ``trace_id``, ``start_ns``,
    ``end_ns``), by ref. Runs without model calls are left out."""
    runs = list(runs)
    ours = [r for r in runs if r.source == sc.SOURCE_AGENTTAPE]
    theirs = [r for r in runs if r.source != sc.SOURCE_AGENTTAPE]
    rows: list[dict[str, Any]] = []
    if ours:
        # from the first run's start on, with no end: a node may start after its run span ended
        rows += ours_calls(reader, [r.ref for r in ours], min(r.start_ns for r in ours))
    if theirs:
        wanted = {r.ref for r in theirs}
        rows += [c for c in foreign_calls(reader, sorted({r.trace_id for r in theirs})) if c["ref"] in wanted]
    out: dict[str, list[dict[str, Any]]] = {}
    for c in rows:
        out.setdefault(c["ref"], []).append(c)
    return out


def price_summaries(reader: Reader, runs: Sequence[Any], prices: Prices) -> None:
    """Set ``cost_usd``, ``priced_calls`` and ``unpriced_calls`` on these ``RunSummary`` rows in place."""
    if not runs:
        return
    calls = calls_of_runs(reader, [r for r in runs if r.model_calls])
    for r in runs:
        cost = prices.cost_of(calls.get(r.ref, ()))
        r.cost_usd = cost.to_json()["usd"]
        r.priced_calls, r.unpriced_calls = cost.priced_calls, cost.unpriced_calls


def node_call(node: Node) -> dict[str, Any]:
    """A rebuilt model node as a call row for ``Prices.cost_of``."""
    u = node.usage
    return {"span_id": node.span_id, "provider": node.provider, "model": node.model or node.request_model,
            "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "cache_read_tokens": u.cache_read_input_tokens, "cache_write_tokens": u.cache_write_input_tokens,
            "start_ns": node.start_ns}


def run_cost(run: Run, prices: Prices, *, calls: bool = True) -> dict[str, Any]:
    """The cost of a rebuilt run's own model calls (``calls``: with each call's dollars: cost per node)."""
    cost = Cost()
    listed = []
    for n in run.model_nodes:
        c = node_call(n)
        usd = prices.call_usd(c["provider"], c["model"], c["input_tokens"], c["output_tokens"],
                              c["cache_read_tokens"], c["cache_write_tokens"], c["start_ns"])
        cost.add_call(usd, c["model"])
        listed.append({"span_id": n.span_id, "provider": c["provider"], "model": c["model"], "usd": usd,
                       "price": prices.price_source(c["provider"], c["model"])})
    out = cost.to_json()
    if calls:
        out["calls"] = listed
    return out


def add_tree_cost(doc: dict[str, Any], run: Run, prices: Prices) -> Cost:
    """Put ``cost`` (the run's own calls) on every run of a ``replay --tree`` document and ``tree_cost``
    (the run and every run below it, each counted once) on each; returns the tree's ``Cost``."""
    own = run_cost(run, prices)
    doc["cost"] = own
    total = Cost(usd=own["usd"] if own["priced_calls"] else None, priced_calls=own["priced_calls"],
                 unpriced_calls=own["unpriced_calls"], unpriced_models=list(own["unpriced_models"]))
    for child_doc, child in zip(doc.get("children") or [], run.children):
        total.add(add_tree_cost(child_doc, child, prices))
    doc["tree_cost"] = total.to_json()
    return total


def total_of(summaries: Iterable[Any]) -> dict[str, Any]:
    """The cost of some runs' summaries (a session's turns, an agent's runs) added up."""
    total = Cost()
    for s in summaries:
        total.add(Cost(usd=s.cost_usd if s.priced_calls else None, priced_calls=s.priced_calls,
                       unpriced_calls=s.unpriced_calls))
    return total.to_json()


CALL_COSTS = "call_costs"
_CALL_COST_FIELDS = [("ref", pa.string()), ("trace_id", pa.string()), ("span_id", pa.string()),
                     ("agent", pa.string()), ("provider", pa.string()), ("model", pa.string()),
                     ("input_tokens", pa.int64()), ("output_tokens", pa.int64()),
                     ("cache_read_tokens", pa.int64()), ("cache_write_tokens", pa.int64()),
                     ("start_time_unix_nano", pa.int64()), ("usd", pa.float64()), ("price", pa.string())]


def call_costs(reader: Reader, prices: Prices) -> pa.Table:
    """Every model call of the store with its dollars (``usd`` null when it has no price) and where the
    price came from: the ``call_costs`` table ``agenttape sql`` adds to the store's tables."""
    rows = ours_calls(reader, None) + foreign_calls(reader, None)
    out: dict[str, list[Any]] = {name: [] for name, _ in _CALL_COST_FIELDS}
    for c in rows:
        usd = prices.call_usd(c["provider"], c["model"], c["input_tokens"], c["output_tokens"],
                              c["cache_read_tokens"], c["cache_write_tokens"], c["start_ns"])
        c = {**c, "start_time_unix_nano": c["start_ns"], "usd": usd,
             "price": prices.price_source(c["provider"], c["model"]) if usd is not None else None}
        for name, _ in _CALL_COST_FIELDS:
            out[name].append(c.get(name))
    return pa.table({name: pa.array(out[name], type=t) for name, t in _CALL_COST_FIELDS})
