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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from otel_agenttape.receiver.chain_links import ChainLinks
from otel_agenttape.receiver.metric_state import CounterState, HistogramState, LabelCap, families, new_runs
from otel_agenttape.receiver.metrics import GENAI_DURATION_BUCKETS
from otel_agenttape.pricing import Prices
from otel_agenttape.receiver.run_steps import OpenRuns
from otel_agenttape.receiver.score_metrics import batch_scores
from otel_agenttape.receiver.span_cost import batch_usd
from otel_agenttape.receiver.span_labels import BatchLabels, flat, rows_containing, seconds, true_mask

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
AGENT_DURATION_BUCKETS = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 102.4, 204.8, 409.6)
STEP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

# distinct values kept per label before the rest become "_other" (docs/operations.md)
LABEL_CAPS = {
    "gen_ai_operation_name": 32, "gen_ai_provider_name": 32, "gen_ai_request_model": 64,
    "gen_ai_response_model": 64, "gen_ai_agent_name": 100, "gen_ai_tool_name": 100, "service_name": 32,
    "status": 16, "error_type": 32, "gen_ai_evaluation_name": 64, "gen_ai_evaluation_score_label": 64,
    "agenttape_score_source": 32,
}
SCORE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 2, 3, 4, 5, 10, 100)
_SCORE = ("gen_ai_evaluation_name", "gen_ai_evaluation_score_label", "agenttape_score_source", "error_type",
          "gen_ai_agent_name", "service_name")
_SCORE_VALUE = ("gen_ai_evaluation_name", "gen_ai_agent_name", "service_name")
# operations with metrics of their own (runs, tools): not client operations
_NOT_CLIENT_OPS = ("invoke_agent", "invoke_workflow", "execute_tool")
_STREAM_EVENTS = ["agenttape.text", "agenttape.reasoning"]
_CHAIN_COLUMNS = ["chain_id", "chain_epoch", "chain_seq", "chain_prev", "chain_hash"]

# label sets; gen_ai_agent_name and service_name are ours (the conventions allow added attributes): they
# let a dashboard filter every panel by agent and service
_MODEL = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_agent_name", "service_name")
_RUN = ("gen_ai_agent_name", "status", "service_name")
_TOOL = ("gen_ai_tool_name", "gen_ai_agent_name", "service_name")
_COST = ("gen_ai_provider_name", "gen_ai_request_model", "gen_ai_agent_name", "service_name")


class SpanMetrics(Collector):
    """GenAI and agent metrics of the stored spans; a ``prometheus_client`` collector."""

    def __init__(self, prices: Prices | None = None) -> None:
        self.prices = prices if prices is not None else Prices.load()
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
        self.cost = C("agenttape_gen_ai_cost_usd_total",
                      "Dollars of model calls priced at ingest (genai-prices and AGENTTAPE_PRICES overrides).", _COST)
        self.unpriced = C("agenttape_gen_ai_unpriced_calls_total",
                          "Model calls without a price (unknown model or no token counts): their cost is unknown.",
                          _COST)
        self.scores = C("agenttape_evaluation_scores_total",
                        "Scores (gen_ai.evaluation.result events) by evaluation name, label, who gave them and "
                        "agent; error_type marks evaluations that failed.", _SCORE)
        self.score_value = H("agenttape_evaluation_score_value", "Score values by evaluation name and agent.",
                             _SCORE_VALUE, SCORE_BUCKETS)
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
        for reason in ("prev_mismatch", "seq_reused"):  # one series each from the start
            self.chain_failures.incr(0, reason)
        # names kept from earlier releases (dashboards may use them)
        self.legacy_tokens = C("agenttape_genai_token_usage_tokens_total", "Tokens used by model and type.",
                               ("gen_ai_response_model", "gen_ai_token_type"))
        self.legacy_duration = H("agenttape_genai_operation_duration_seconds", "Duration of GenAI operation spans.",
                                 ("gen_ai_operation_name",), GENAI_DURATION_BUCKETS)
        self.legacy_calls = C("agenttape_genai_tool_calls_total", "Tool call spans by tool.", ("gen_ai_tool_name",))
        self.legacy_errors = C("agenttape_genai_tool_errors_total", "Tool call spans with error status by tool.",
                               ("gen_ai_tool_name",))
        self._texts: list[str] = []  # each family's text at the last scrape, and all of it joined
        self._text = ""
        self._open_runs = OpenRuns()
        self._chains = ChainLinks()

    def states(self) -> list[CounterState | HistogramState]:
        return [v for v in vars(self).values() if isinstance(v, (CounterState, HistogramState))]

    def collect(self) -> Iterable[Metric]:
        return families(self.states())

    def render_text(self) -> str:
        """Prometheus text of every family (series unchanged since the last scrape come from cache)."""
        texts = [s.render_text() for s in self.states()]
        if len(texts) != len(self._texts) or any(a is not b for a, b in zip(texts, self._texts)):
            self._texts, self._text = texts, "".join(texts)
        return self._text

    # -- derivation -----------------------------------------------------------------------------

    def observe(self, tables: dict[str, pa.Table]) -> None:
        """Add one committed batch (``spans``, ``span_events`` and ``log_records`` tables of ``store.rows``)."""
        self._scores(tables)
        spans = tables.get("spans")
        if spans is None or not spans.num_rows:
            return
        op = _Operations(flat(spans.column("operation_name")))
        node = flat(spans.column("node_type"))
        dur = seconds(spans.column("end_time_unix_nano"), spans.column("start_time_unix_nano"))
        err = flat(pc.equal(spans.column("status_code"), 2))
        labels = BatchLabels(self.caps, spans, err, {"operation_name": op.encoded})
        self._models(spans, op, dur, labels, tables.get("span_events"))
        tools = np.flatnonzero(op.is_any("execute_tool") | true_mask(pc.equal(node, "tool")))
        if len(tools):
            self._tools(tools, dur, true_mask(err), labels)
        is_run = op.is_any("invoke_agent") | true_mask(pc.equal(node, "run"))
        self._steps(spans, is_run, dur, labels)
        chain_id = spans.column("chain_id")
        if chain_id.null_count < len(chain_id):
            links = spans.select(_CHAIN_COLUMNS)
            if chain_id.null_count:
                links = links.filter(pc.is_valid(chain_id))
            checked, prev_bad, reused_bad = self._chains.check(links)
            if checked:
                self.chain_checked.incr(checked)
            if prev_bad:
                self.chain_failures.incr(prev_bad, "prev_mismatch")
            if reused_bad:
                self.chain_failures.incr(reused_bad, "seq_reused")
        if op.named.any():
            rows = None if op.named.all() else np.flatnonzero(op.named)
            self.legacy_duration.add_sets(labels.groups(("gen_ai_operation_name",)), rows,
                                          dur if rows is None else dur[rows])

    def _models(self, spans: pa.Table, op: _Operations, dur: np.ndarray, labels: BatchLabels,
                events: pa.Table | None) -> None:
        client = np.flatnonzero(op.named & ~op.is_any(*_NOT_CLIENT_OPS))
        if len(client):
            self.op_duration.add_sets(labels.groups(_MODEL + ("error_type",)), client, dur[client])
        for typ, col in (("input", "input_tokens"), ("output", "output_tokens")):
            tokens = flat(spans.column(col))
            if tokens.null_count == len(tokens):
                continue
            rows = np.flatnonzero(tokens.is_valid().to_numpy(zero_copy_only=False)) if tokens.null_count else None
            values = pc.fill_null(tokens, 0).to_numpy().astype(np.float64)
            if rows is not None:
                values = values[rows]
            self.token_usage.add_sets(labels.groups(_MODEL), rows, values, (typ,))
            self.legacy_tokens.add_sets(labels.groups(("legacy_model",)), rows, values, (typ,))
        if len(client):
            usd, priced = batch_usd(spans, client, self.prices)
            sets = labels.groups(_COST)
            if priced.any():
                self.cost.add_sets(sets, client[priced], usd[priced])
            if not priced.all():
                self.unpriced.add_sets(sets, client[~priced])
        if events is not None and events.num_rows and len(client):
            self._first_chunk(spans, client, labels, events)

    def _first_chunk(self, spans: pa.Table, client: np.ndarray, labels: BatchLabels, events: pa.Table) -> None:
        """Seconds from a model span's start to its first text or reasoning event (streamed calls only).
        Events are matched to spans by span id within the batch (64 random bits: a clash between two
        traces of one batch would cost one sample, not a count)."""
        names = events.column("name")
        streamed = np.flatnonzero(true_mask(pc.equal(names, _STREAM_EVENTS[0]))
                                  | true_mask(pc.equal(names, _STREAM_EVENTS[1])))
        if not len(streamed):
            return
        sid = flat(events.column("span_id"))
        if len(sid) > 1:  # a span's events are usually adjacent: only the first streamed one of each run
            block = np.zeros(len(sid), dtype=np.int64)  # of adjacent events with one span id can be its first
            new = pc.fill_null(pc.not_equal(sid.slice(1), sid.slice(0, len(sid) - 1)), True)
            np.cumsum(new.to_numpy(zero_copy_only=False), out=block[1:])
            run = block[streamed]
            streamed = streamed[new_runs(run)]
        at = pc.index_in(sid.take(streamed), value_set=flat(spans.column("span_id")).take(client))
        pos = pc.fill_null(at, -1).to_numpy(zero_copy_only=False)
        hit = pos >= 0
        if not hit.any():
            return
        pos = pos[hit]
        times = flat(events.column("time_unix_nano")).to_numpy()[streamed[hit]]
        first = np.zeros(len(client), dtype=np.int64)
        first[pos[::-1]] = times[::-1]  # the first event of each span in table order (its event order)
        seen = np.zeros(len(client), dtype=bool)
        seen[pos] = True
        start = flat(spans.column("start_time_unix_nano")).to_numpy()[client]
        ttfc = np.clip((first[seen] - start[seen]) / 1e9, 0, None)
        self.ttfc.add_sets(labels.groups(_MODEL), client[seen], ttfc)

    def _scores(self, tables: dict[str, pa.Table]) -> None:
        found = batch_scores(tables)
        if not found:
            return
        cols = {k: [f[k] for f in found] for k in ("name", "label", "source", "error_type", "agent", "service")}
        codes = {label: self.caps[label].codes(pa.array(cols[key], pa.string())) for label, key in (
            ("gen_ai_evaluation_name", "name"), ("gen_ai_evaluation_score_label", "label"),
            ("agenttape_score_source", "source"), ("error_type", "error_type"), ("gen_ai_agent_name", "agent"),
            ("service_name", "service"))}
        self.scores.add([codes[label] for label in _SCORE])
        valued = np.flatnonzero([f["value"] is not None for f in found])
        if len(valued):
            values = np.array([found[i]["value"] for i in valued], dtype=np.float64)
            self.score_value.add([(codes[label][0][valued], codes[label][1]) for label in _SCORE_VALUE], values)

    def _tools(self, tools: np.ndarray, dur: np.ndarray, err: np.ndarray, labels: BatchLabels) -> None:
        failed = tools[err[tools]]
        if len(failed):  # grouped first, so the tool labels alone come from its sets
            self.tool_errors.add_sets(labels.groups(_TOOL + ("error_type",)), failed)
        sets = labels.groups(_TOOL)
        self.tool_calls.add_sets(sets, tools)
        self.tool_duration.add_sets(sets, tools, dur[tools])
        self.legacy_calls.add_sets(labels.groups(("gen_ai_tool_name",)), tools)
        if len(failed):
            self.legacy_errors.add_sets(labels.groups(("gen_ai_tool_name",)), failed)

    def _steps(self, spans: pa.Table, is_run: np.ndarray, dur: np.ndarray, labels: BatchLabels) -> None:
        """Runs, their duration, and their steps (``OpenRuns``: the highest step of each run's spans)."""
        steps = self._open_runs.observe(flat(spans.column("run_id")), flat(spans.column("step")), is_run)
        if not len(steps):
            return
        runs = np.flatnonzero(is_run)
        sets = labels.groups(_RUN)
        self.runs.add_sets(sets, runs)
        self.run_duration.add_sets(sets, runs, dur[runs])
        self.run_steps.add_sets(labels.groups(("gen_ai_agent_name", "service_name")), runs, steps)


class _Operations:
    """``gen_ai.operation.name`` of a batch, encoded once: the masks of operations, and the encoding
    the operation label reuses."""

    def __init__(self, column: pa.Array) -> None:
        if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
            column = column.cast(pa.string())
        self.encoded = column.dictionary_encode()
        self.names = self.encoded.dictionary.to_pylist()
        codes = self.encoded.indices
        self.codes = (pc.fill_null(codes, -1) if codes.null_count else codes).to_numpy(zero_copy_only=False)
        self.named = self.codes >= 0

    def is_any(self, *names: str) -> np.ndarray:
        """Rows whose operation is one of ``names``."""
        wanted = [i for i, n in enumerate(self.names) if n in names]
        if not wanted:
            return np.zeros(len(self.codes), dtype=bool)
        if len(wanted) == 1:
            return self.codes == wanted[0]
        return np.isin(self.codes, wanted)


def _rows_containing(strings: pa.Array, needle: bytes) -> np.ndarray:
    """Indices of the strings that contain ``needle`` (``span_labels.rows_containing``)."""
    return rows_containing(strings, needle)
