"""Metrics derived from the spans the receiver stores, as they are stored.

The writer hands each committed batch (``WriteResult.tables``: exactly the rows inserted, so a re-sent
span is never counted twice) to ``SpanMetrics.observe``, which aggregates it with ``pyarrow`` and
adds the result to bounded in-memory state. A scrape only formats that state: it never reads the
store. Values count from the start of the process (Prometheus' ``rate()`` handles the reset).

Names follow the OpenTelemetry GenAI metric conventions as Prometheus renders an OTLP metric (dots
to underscores, the unit ``s`` as a ``_seconds`` suffix, ``{token}`` dropped):
``gen_ai.client.token.usage`` is ``gen_ai_client_token_usage``, ``gen_ai.client.operation.duration``
is ``gen_ai_client_operation_duration_seconds`` and ``gen_ai.client.operation.time_to_first_chunk``
is ``gen_ai_client_operation_time_to_first_chunk_seconds``, so dashboards also work for metrics that
instrumentations send through a collector. What the conventions do not name is ``agenttape_*``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from otel_agenttape.integrity.chain import genesis, genesis_v1
from otel_agenttape.receiver.metric_state import CounterState, HistogramState, LabelCap, families
from otel_agenttape.receiver.metrics import GENAI_DURATION_BUCKETS

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
AGENT_DURATION_BUCKETS = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 102.4, 204.8, 409.6)
STEP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

# distinct values kept per label before the rest become "_other" (docs/operations.md)
LABEL_CAPS = {
    "gen_ai_operation_name": 32, "gen_ai_provider_name": 32, "gen_ai_request_model": 64,
    "gen_ai_response_model": 64, "gen_ai_agent_name": 100, "gen_ai_tool_name": 100, "service_name": 32,
    "status": 16, "error_type": 32,
}
_COLUMN = {"gen_ai_operation_name": "operation_name", "gen_ai_provider_name": "provider_name",
           "gen_ai_request_model": "request_model", "gen_ai_response_model": "response_model",
           "gen_ai_agent_name": "agent_name", "gen_ai_tool_name": "tool_name", "service_name": "service_name"}
# operations with metrics of their own (runs, tools): not client operations
_NOT_CLIENT_OPS = ["invoke_agent", "invoke_workflow", "execute_tool"]
_STREAM_EVENTS = ["agenttape.text", "agenttape.reasoning"]
MAX_OPEN_RUNS = 100_000  # runs whose steps are counted while their run span has not arrived
MAX_CHAINS = 50_000  # tapes whose last link is remembered to check the next one

# label sets; gen_ai_agent_name and service_name are ours (the conventions allow added attributes): they
# let a dashboard filter every panel by agent and service
_MODEL = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_agent_name", "service_name")
_RUN = ("gen_ai_agent_name", "status", "service_name")
_TOOL = ("gen_ai_tool_name", "gen_ai_agent_name", "service_name")


class SpanMetrics(Collector):
    """GenAI and agent metrics of the stored spans; a ``prometheus_client`` collector."""

    def __init__(self) -> None:
        self.caps = {name: LabelCap(name, limit) for name, limit in LABEL_CAPS.items()}
        H, C = HistogramState, CounterState
        self.token_usage = H("gen_ai_client_token_usage", "Tokens per GenAI operation (gen_ai.usage.*), by type.",
                             _MODEL + ("gen_ai_token_type",), TOKEN_BUCKETS)
        self.op_duration = H("gen_ai_client_operation_duration_seconds",
                             "Duration of GenAI client operations (model calls), with error_type on failure.",
                             _MODEL + ("error_type",), GENAI_DURATION_BUCKETS)
        self.ttfc = H("gen_ai_client_operation_time_to_first_chunk_seconds",
                      "Time from a streamed model call's start to its first text or reasoning event.",
                      _MODEL, GENAI_DURATION_BUCKETS)
        self.runs = C("agenttape_runs_total", "Agent runs (invoke_agent spans) by agent and final status.", _RUN)
        self.run_duration = H("agenttape_run_duration_seconds", "Duration of agent runs.", _RUN,
                              AGENT_DURATION_BUCKETS)
        self.run_steps = H("agenttape_run_steps", "Steps (highest agenttape.step) per finished agent run.",
                           ("gen_ai_agent_name", "service_name"), STEP_BUCKETS)
        self.tool_calls = C("agenttape_tool_calls_total", "Tool calls (execute_tool spans) by tool.", _TOOL)
        self.tool_errors = C("agenttape_tool_errors_total", "Tool calls that ended in error, by tool and error type.",
                             _TOOL + ("error_type",))
        self.tool_duration = H("agenttape_tool_duration_seconds", "Duration of tool calls.", _TOOL,
                               GENAI_DURATION_BUCKETS)
        self.chain_checked = C("agenttape_chain_links_checked_total",
                               "Chain links whose predecessor was seen, so the link could be checked.", ())
        self.chain_failures = C("agenttape_chain_verification_failures_total",
                                "Sealed spans whose chain link does not follow from the link before it, by reason.",
                                ("reason",))
        for reason in ("prev_mismatch", "genesis_mismatch", "seq_reused"):  # one series each from the start
            self.chain_failures.incr(0, reason)
        # names kept from earlier releases (dashboards may use them)
        self.legacy_tokens = C("agenttape_genai_token_usage_tokens_total", "Tokens used by model and type.",
                               ("gen_ai_response_model", "gen_ai_token_type"))
        self.legacy_duration = H("agenttape_genai_operation_duration_seconds", "Duration of GenAI operation spans.",
                                 ("gen_ai_operation_name",), GENAI_DURATION_BUCKETS)
        self.legacy_calls = C("agenttape_genai_tool_calls_total", "Tool call spans by tool.", ("gen_ai_tool_name",))
        self.legacy_errors = C("agenttape_genai_tool_errors_total", "Tool call spans with error status by tool.",
                               ("gen_ai_tool_name",))
        self._open_runs: dict[str, int] = {}
        self._chains: dict[tuple[str, int], tuple[int, str]] = {}

    def states(self) -> list[CounterState | HistogramState]:
        return [v for v in vars(self).values() if isinstance(v, (CounterState, HistogramState))]

    def collect(self) -> Iterable[Metric]:
        return families(self.states())

    # -- derivation -----------------------------------------------------------------------------

    def observe(self, tables: dict[str, pa.Table]) -> None:
        """Add one committed batch (``spans`` and ``span_events`` tables of ``store.rows``)."""
        spans = tables.get("spans")
        if spans is None or not spans.num_rows:
            return
        op = spans.column("operation_name")
        node = spans.column("node_type")
        dur = _seconds(spans.column("end_time_unix_nano"), spans.column("start_time_unix_nano"))
        err = pc.equal(spans.column("status_code"), 2).combine_chunks()
        labels = _Labels(self, spans, err)
        self._models(spans, op, dur, labels, tables.get("span_events"))
        is_tool = _true(pc.or_kleene(pc.equal(op, "execute_tool"), pc.equal(node, "tool")))
        if is_tool.any():
            self._tools(is_tool, dur, err, labels)
        is_run = _true(pc.or_kleene(pc.equal(op, "invoke_agent"), pc.equal(node, "run")))
        self._steps(spans, is_run, labels)
        has_chain = _true(pc.is_valid(spans.column("chain_id")))
        if has_chain.any():
            self._check_chains(spans.filter(pa.array(has_chain)))
        has_op = _true(pc.is_valid(op))
        if has_op.any():
            self.legacy_duration.add([labels.get("gen_ai_operation_name", has_op)], dur[has_op])

    def _models(self, spans: pa.Table, op: Any, dur: np.ndarray, labels: _Labels, events: pa.Table | None) -> None:
        client = _true(pc.and_kleene(pc.is_valid(op), pc.invert(pc.is_in(op, pa.array(_NOT_CLIENT_OPS)))))
        if client.any():
            self.op_duration.add(labels.many(_MODEL + ("error_type",), client), dur[client])
        for typ, col in (("input", "input_tokens"), ("output", "output_tokens")):
            tokens = spans.column(col)
            has = _true(pc.is_valid(tokens))
            if not has.any():
                continue
            values = tokens.filter(pa.array(has)).to_numpy().astype(np.float64)
            kind = pa.array(np.full(int(has.sum()), typ))
            self.token_usage.add(labels.many(_MODEL, has) + [kind], values)
            model = pc.coalesce(labels.get("gen_ai_response_model", has), "")
            request = labels.get("gen_ai_request_model", has)
            model = pc.if_else(pc.equal(model, ""), request, model)
            self.legacy_tokens.add([model, kind], values)
        if events is not None and events.num_rows and client.any():
            self._first_chunk(spans, client, labels, events)

    def _first_chunk(self, spans: pa.Table, client: np.ndarray, labels: _Labels, events: pa.Table) -> None:
        streamed = events.filter(pc.is_in(events.column("name"), pa.array(_STREAM_EVENTS)))
        if not streamed.num_rows:
            return
        first = streamed.group_by(["trace_id", "span_id"], use_threads=False).aggregate([("time_unix_nano", "min")])
        idx = np.flatnonzero(client)
        cols = labels.many(_MODEL, client)
        model = pa.table({"trace_id": spans.column("trace_id").take(idx), "span_id": spans.column("span_id").take(idx),
                          "start": spans.column("start_time_unix_nano").take(idx),
                          **{f"l{i}": c for i, c in enumerate(cols)}})
        joined = model.join(first, ["trace_id", "span_id"], join_type="inner", use_threads=False)
        if not joined.num_rows:
            return
        ttfc = _seconds(joined.column("time_unix_nano_min"), joined.column("start")).clip(min=0)
        self.ttfc.add([joined.column(f"l{i}").combine_chunks() for i in range(len(cols))], ttfc)

    def _tools(self, is_tool: np.ndarray, dur: np.ndarray, err: pa.Array, labels: _Labels) -> None:
        self.tool_calls.add(labels.many(_TOOL, is_tool))
        self.tool_duration.add(labels.many(_TOOL, is_tool), dur[is_tool])
        self.legacy_calls.add([labels.get("gen_ai_tool_name", is_tool)])
        failed = is_tool & _true(err)
        if failed.any():
            self.tool_errors.add(labels.many(_TOOL + ("error_type",), failed))
            self.legacy_errors.add([labels.get("gen_ai_tool_name", failed)])

    def _steps(self, spans: pa.Table, is_run: np.ndarray, labels: _Labels) -> None:
        """Remember the highest step of each open run; observe it when the run's own span arrives."""
        run_id, step = spans.column("run_id"), spans.column("step")
        inner = _true(pc.and_kleene(pc.is_valid(step), pc.is_valid(run_id))) & ~is_run
        if inner.any():
            g = pa.table({"r": run_id.filter(pa.array(inner)), "s": step.filter(pa.array(inner))}) \
                .group_by("r", use_threads=False).aggregate([("s", "max")])
            open_runs = self._open_runs
            for r, s in zip(g.column("r").to_pylist(), g.column("s_max").to_pylist()):
                if s > open_runs.get(r, -1):
                    open_runs.pop(r, None)
                    open_runs[r] = s
            while len(open_runs) > MAX_OPEN_RUNS:
                open_runs.pop(next(iter(open_runs)))
        if not is_run.any():
            return
        self.runs.add(labels.many(_RUN, is_run))
        dur = _seconds(spans.column("end_time_unix_nano"), spans.column("start_time_unix_nano"))
        self.run_duration.add(labels.many(_RUN, is_run), dur[is_run])
        ids = run_id.filter(pa.array(is_run)).to_pylist()
        steps = np.array([self._open_runs.pop(r, 0) if r else 0 for r in ids], dtype=np.float64)
        self.run_steps.add(labels.many(("gen_ai_agent_name", "service_name"), is_run), steps)

    def _check_chains(self, t: pa.Table) -> None:
        """Each sealed span's ``chain_prev`` must be the ``chain_hash`` of the span before it in its tape
        (or the tape's genesis for seq 0). Checked within the batch and against the last link remembered
        per tape; links whose predecessor is not known (out of order, evicted) are not checked."""
        t = t.select(["chain_id", "chain_epoch", "chain_seq", "chain_prev", "chain_hash"])
        t = t.sort_by([("chain_id", "ascending"), ("chain_epoch", "ascending"), ("chain_seq", "ascending")])
        n = t.num_rows
        cid = t.column("chain_id").combine_chunks()
        group = cid.dictionary_encode().indices.to_numpy(zero_copy_only=False).astype(np.int64)
        epoch = pc.fill_null(t.column("chain_epoch"), 0).to_numpy().astype(np.int64)
        seq = pc.fill_null(t.column("chain_seq"), -1).to_numpy().astype(np.int64)
        prev = t.column("chain_prev").combine_chunks()
        hsh = t.column("chain_hash").combine_chunks()
        fails: dict[str, int] = {}
        checked = 0
        if n > 1:  # each link against the one before it in the batch
            same = (group[1:] == group[:-1]) & (epoch[1:] == epoch[:-1])
            differs = _true(pc.not_equal(prev.slice(1), hsh.slice(0, n - 1)))
            redo = _true(pc.not_equal(hsh.slice(1), hsh.slice(0, n - 1)))
            follows = same & (seq[1:] == seq[:-1] + 1)
            reused = same & (seq[1:] == seq[:-1])
            checked += int(follows.sum() + reused.sum())
            _add(fails, "prev_mismatch", int((follows & differs).sum()))
            _add(fails, "seq_reused", int((reused & redo).sum()))
        starts = np.flatnonzero(np.r_[True, (group[1:] != group[:-1]) | (epoch[1:] != epoch[:-1])])
        ends = np.r_[starts[1:] - 1, n - 1]
        ids = cid.take(pa.array(starts)).to_pylist()
        first_prev = prev.take(pa.array(starts)).to_pylist()
        first_hash = hsh.take(pa.array(starts)).to_pylist()
        last_hash = hsh.take(pa.array(ends)).to_pylist()
        for j, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
            key = (ids[j], int(epoch[a]))
            s0 = int(seq[a])
            known = self._chains.get(key)
            if s0 == 0:  # the first link of a tape starts from its genesis
                checked += 1
                if first_prev[j] not in (genesis(key[0], key[1]), genesis_v1(key[0], key[1])):
                    _add(fails, "genesis_mismatch", 1)
            elif known is not None and s0 == known[0] + 1:
                checked += 1
                if first_prev[j] != known[1]:
                    _add(fails, "prev_mismatch", 1)
            elif known is not None and s0 == known[0]:
                checked += 1
                if first_hash[j] != known[1]:
                    _add(fails, "seq_reused", 1)
            if known is None or int(seq[b]) >= known[0]:
                self._remember(key, (int(seq[b]), last_hash[j]))
        if checked:
            self.chain_checked.incr(checked)
        for reason, count in fails.items():
            self.chain_failures.incr(count, reason)

    def _remember(self, key: tuple[str, int], last: tuple[int, str]) -> None:
        chains = self._chains
        chains.pop(key, None)
        chains[key] = last
        if len(chains) > MAX_CHAINS:
            chains.pop(next(iter(chains)))


class _Labels:
    """Capped label columns of one batch, computed once per label and shared by every metric."""

    def __init__(self, owner: SpanMetrics, spans: pa.Table, err: pa.Array) -> None:
        self.owner, self.spans, self.err = owner, spans, err
        self._full: dict[str, pa.Array] = {}

    def _column(self, name: str) -> pa.Array:
        col = self._full.get(name)
        if col is None:
            cap = self.owner.caps[name]
            if name == "status":
                col = cap.apply(_run_status(self.spans, self.err))
            elif name == "error_type":
                col = cap.apply(_error_types(self.spans, self.err))
            else:
                col = cap.apply(self.spans.column(_COLUMN[name]))
            self._full[name] = col
        return col

    def get(self, name: str, mask: np.ndarray) -> pa.Array:
        return self._column(name).filter(pa.array(mask))

    def many(self, names: tuple[str, ...], mask: np.ndarray) -> list[pa.Array]:
        return [self.get(n, mask) for n in names]


def _run_status(spans: pa.Table, err: pa.Array) -> pa.Array:
    status = spans.column("run_status").combine_chunks()
    fallback = pc.if_else(err, "error", "completed")
    return pc.coalesce(status, fallback)


def _error_types(spans: pa.Table, err: pa.Array) -> pa.Array:
    """``error.type`` of failed spans (``_OTHER`` when a failed span names none), null elsewhere.
    Only the attributes of failed spans are parsed."""
    idx = np.flatnonzero(_true(err))
    out: list[str | None] = [None] * spans.num_rows
    if len(idx):
        attrs = spans.column("attributes").take(idx).to_pylist()
        for i, raw in zip(idx, attrs):
            value = None
            if raw and '"error.type"' in raw:
                try:
                    value = (orjson.loads(raw).get("error.type") or {}).get("s")
                except (orjson.JSONDecodeError, AttributeError):
                    value = None
            out[i] = value if isinstance(value, str) and value else "_OTHER"
    return pa.array(out, pa.string())


def _add(counts: dict[str, int], key: str, n: int) -> None:
    if n:
        counts[key] = counts.get(key, 0) + n


def _true(mask: Any) -> np.ndarray:
    """A boolean numpy mask from an Arrow boolean array (null counts as false)."""
    if isinstance(mask, pa.ChunkedArray):
        mask = mask.combine_chunks()
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False)


def _seconds(end: Any, start: Any) -> np.ndarray:
    diff = pc.subtract(end, start)
    if isinstance(diff, pa.ChunkedArray):
        diff = diff.combine_chunks()
    return pc.fill_null(diff, 0).to_numpy(zero_copy_only=False).astype(np.float64) / 1e9
