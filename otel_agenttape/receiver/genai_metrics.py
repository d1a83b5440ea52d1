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

import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from otel_agenttape.receiver.metric_state import Codes, CounterState, HistogramState, LabelCap, constant, families
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
_STREAM_SET = pa.array(_STREAM_EVENTS)
_CHAIN_COLUMNS = ["chain_id", "chain_epoch", "chain_seq", "chain_prev", "chain_hash"]
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
        self._open_runs: dict[str, int] = {}
        self._chains: dict[tuple[str, int], tuple[int, str]] = {}

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
        self._steps(spans, is_run, dur, labels)
        has_chain = _true(pc.is_valid(spans.column("chain_id")))
        if has_chain.any():
            self._check_chains(spans.select(_CHAIN_COLUMNS).filter(pa.array(has_chain)))
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
            values = pc.fill_null(tokens, 0).to_numpy().astype(np.float64)[has]
            kind = constant(typ, int(has.sum()))
            self.token_usage.add(labels.many(_MODEL, has) + [kind], values)
            self.legacy_tokens.add([labels.get("legacy_model", has), kind], values)
        if events is not None and events.num_rows and client.any():
            self._first_chunk(spans, client, labels, events)

    def _first_chunk(self, spans: pa.Table, client: np.ndarray, labels: _Labels, events: pa.Table) -> None:
        """Seconds from a model span's start to its first text or reasoning event (streamed calls only).
        Events are matched to spans by span id within the batch (64 random bits: a clash between two
        traces of one batch would cost one sample, not a count)."""
        ev = events.select(["span_id", "time_unix_nano", "name"])
        streamed = ev.filter(pc.is_in(ev.column("name"), value_set=_STREAM_SET))
        if not streamed.num_rows:
            return
        sid = _flat(streamed.column("span_id"))
        if len(sid) > 1:  # a span's events are usually adjacent: only the first of each run can be the first
            later = _true(pc.equal(sid.slice(1), sid.slice(0, len(sid) - 1)))
            if later.any():
                streamed = streamed.filter(pa.array(np.r_[True, ~later]))
        idx = np.flatnonzero(client)
        at = pc.index_in(streamed.column("span_id"), value_set=_flat(spans.column("span_id")).take(pa.array(idx)))
        pos = pc.fill_null(at, -1).to_numpy(zero_copy_only=False)
        hit = pos >= 0
        if not hit.any():
            return
        pos = pos[hit]
        times = streamed.column("time_unix_nano").to_numpy()[hit]
        first = np.zeros(len(idx), dtype=np.int64)
        first[pos[::-1]] = times[::-1]  # the first event of each span in table order (its event order)
        seen = np.zeros(len(idx), dtype=bool)
        seen[pos] = True
        start = spans.column("start_time_unix_nano").to_numpy()[idx]
        ttfc = np.clip((first[seen] - start[seen]) / 1e9, 0, None)
        mask = np.zeros(spans.num_rows, dtype=bool)
        mask[idx[seen]] = True
        self.ttfc.add(labels.many(_MODEL, mask), ttfc)

    def _tools(self, is_tool: np.ndarray, dur: np.ndarray, err: pa.Array, labels: _Labels) -> None:
        self.tool_calls.add(labels.many(_TOOL, is_tool))
        self.tool_duration.add(labels.many(_TOOL, is_tool), dur[is_tool])
        self.legacy_calls.add([labels.get("gen_ai_tool_name", is_tool)])
        failed = is_tool & _true(err)
        if failed.any():
            self.tool_errors.add(labels.many(_TOOL + ("error_type",), failed))
            self.legacy_errors.add([labels.get("gen_ai_tool_name", failed)])

    def _steps(self, spans: pa.Table, is_run: np.ndarray, dur: np.ndarray, labels: _Labels) -> None:
        """Remember the highest step of each open run; observe it when the run's own span arrives."""
        run_id, step = spans.column("run_id"), spans.column("step")
        inner = _true(pc.and_kleene(pc.is_valid(step), pc.is_valid(run_id))) & ~is_run
        open_runs = self._open_runs
        if inner.any():
            enc = _flat(run_id).filter(pa.array(inner)).dictionary_encode()
            code = enc.indices.to_numpy(zero_copy_only=False)
            highest = np.full(len(enc.dictionary), -1, dtype=np.int64)
            st = step.filter(pa.array(inner)).to_numpy().astype(np.int64)
            order = np.argsort(st, kind="stable")
            highest[code[order]] = st[order]  # the last write per run is its highest step
            rs, ss = enc.dictionary.to_pylist(), highest.tolist()
            before = [open_runs.get(r, -1) for r in rs]
            open_runs.update((r, s) for r, s, b in zip(rs, ss, before) if s > b)
            excess = len(open_runs) - MAX_OPEN_RUNS
            if excess > 0:
                for r in list(itertools.islice(open_runs, excess)):
                    del open_runs[r]
        if not is_run.any():
            return
        run_labels = labels.many(_RUN, is_run)
        self.runs.add(run_labels)
        self.run_duration.add(run_labels, dur[is_run])
        ids = run_id.filter(pa.array(is_run)).to_pylist()
        steps = np.array([open_runs.pop(r, 0) if r else 0 for r in ids], dtype=np.float64)
        self.run_steps.add(labels.many(("gen_ai_agent_name", "service_name"), is_run), steps)

    def _check_chains(self, t: pa.Table) -> None:
        """Each sealed span's ``chain_prev`` must be the ``chain_hash`` of the span before it in its tape.
        Checked within the batch and against the last link remembered per tape; a link whose predecessor
        is not known (a first link, out of order, evicted) is left to ``agenttape verify``."""
        cid = _flat(t.column("chain_id"))
        group = cid.dictionary_encode().indices.to_numpy(zero_copy_only=False).astype(np.int64)
        epoch = pc.fill_null(t.column("chain_epoch"), 0).to_numpy().astype(np.int64)
        seq = pc.fill_null(t.column("chain_seq"), -1).to_numpy().astype(np.int64)
        order = np.lexsort((seq, epoch, group))
        if not (order[1:] > order[:-1]).all():  # usually they arrive in order already
            take = pa.array(order)
            group, epoch, seq, cid = group[order], epoch[order], seq[order], cid.take(take)
            prev, hsh = _flat(t.column("chain_prev")).take(take), _flat(t.column("chain_hash")).take(take)
        else:
            prev, hsh = _flat(t.column("chain_prev")), _flat(t.column("chain_hash"))
        n = len(seq)
        checked = prev_bad = reused_bad = 0
        if n > 1:  # each link against the one before it in the batch
            same = (group[1:] == group[:-1]) & (epoch[1:] == epoch[:-1])
            follows = same & (seq[1:] == seq[:-1] + 1)
            reused = same & (seq[1:] == seq[:-1])
            checked += int(follows.sum() + reused.sum())
            prev_bad += int((follows & _true(pc.not_equal(prev.slice(1), hsh.slice(0, n - 1)))).sum())
            reused_bad += int((reused & _true(pc.not_equal(hsh.slice(1), hsh.slice(0, n - 1)))).sum())
        starts = np.flatnonzero(np.r_[True, (group[1:] != group[:-1]) | (epoch[1:] != epoch[:-1])])
        ends = np.r_[starts[1:] - 1, n - 1]
        keys = list(zip(cid.take(pa.array(starts)).to_pylist(), epoch[starts].tolist()))
        chains = self._chains
        known = [chains.get(k) for k in keys]
        if any(k is not None for k in known):  # first links of the batch against the remembered ones
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
        chains.update((key, link) for key, link, k in zip(keys, last, known) if k is None or link[0] >= k[0])
        excess = len(chains) - MAX_CHAINS
        if excess > 0:
            for key in list(itertools.islice(chains, excess)):
                del chains[key]
        if checked:
            self.chain_checked.incr(checked)
        if prev_bad:
            self.chain_failures.incr(prev_bad, "prev_mismatch")
        if reused_bad:
            self.chain_failures.incr(reused_bad, "seq_reused")


class _Labels:
    """Capped label codes of one batch, computed once per label and shared by every metric."""

    def __init__(self, owner: SpanMetrics, spans: pa.Table, err: pa.Array) -> None:
        self.owner, self.spans, self.err = owner, spans, err
        self._full: dict[str, Codes] = {}

    def _column(self, name: str) -> Codes:
        col = self._full.get(name)
        if col is None:
            if name == "status":
                col = self.owner.caps[name].codes(_run_status(self.spans, self.err))
            elif name == "error_type":
                col = self.owner.caps[name].codes(_error_types(self.spans, self.err))
            elif name == "legacy_model":  # the response model, else the requested one
                col = self.owner.caps["gen_ai_response_model"].codes(
                    pc.coalesce(self.spans.column("response_model"), self.spans.column("request_model")))
            else:
                col = self.owner.caps[name].codes(self.spans.column(_COLUMN[name]))
            self._full[name] = col
        return col

    def get(self, name: str, mask: np.ndarray) -> Codes:
        codes, values = self._column(name)
        return codes[mask], values

    def many(self, names: tuple[str, ...], mask: np.ndarray) -> list[Codes]:
        return [self.get(n, mask) for n in names]


def _run_status(spans: pa.Table, err: pa.Array) -> pa.Array:
    status = spans.column("run_status").combine_chunks()
    fallback = pc.if_else(err, "error", "completed")
    return pc.coalesce(status, fallback)


_ERROR_TYPE = r'"error\.type":\{"s":"(?P<t>(?:[^"\\]|\\.)*)"'


def _error_types(spans: pa.Table, err: pa.Array) -> pa.Array:
    """``error.type`` of failed spans (``_OTHER`` when a failed span names none), null elsewhere.
    Read with one regular expression over the typed-JSON attributes of the failed spans only."""
    out = pa.nulls(spans.num_rows, pa.string())
    idx = np.flatnonzero(_true(err))
    if not len(idx):
        return out
    attrs = spans.column("attributes").take(idx)
    if isinstance(attrs, pa.ChunkedArray):
        attrs = attrs.combine_chunks()
    if not pa.types.is_string(attrs.type):
        attrs = attrs.cast(pa.string())
    named = _rows_containing(attrs, b'"error.type":')  # the pattern runs only where it can match
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


def _rows_containing(strings: pa.Array, needle: bytes) -> np.ndarray:
    """Indices of the strings that contain ``needle``: one ``bytes.find`` scan over the array's data
    buffer (several times faster than ``pc.match_substring`` on long JSON), rows from the offsets."""
    if strings.null_count:
        strings = pc.fill_null(strings, "")
    offsets_buf, data_buf = strings.buffers()[1:3]
    if data_buf is None:
        return np.zeros(0, dtype=np.int64)
    width = 8 if pa.types.is_large_string(strings.type) else 4
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if width == 8 else np.int32, count=len(strings) + 1,
                            offset=strings.offset * width)
    data = data_buf.to_pybytes()
    lo, hi = int(offsets[0]), int(offsets[-1])
    found = []
    at = data.find(needle, lo, hi)
    while at >= 0:
        row = int(np.searchsorted(offsets, at, side="right")) - 1
        if at + len(needle) <= offsets[row + 1]:  # the match lies inside that string
            found.append(row)
            at = data.find(needle, int(offsets[row + 1]), hi)  # next row
        else:
            at = data.find(needle, at + 1, hi)
    return np.asarray(found, dtype=np.int64)


def _flat(column: Any) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


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
