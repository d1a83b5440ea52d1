"""Receiver counters and the Prometheus text exposition of ``GET /metrics``.

Receiver metrics (requests, spans accepted/stored/rejected, queue and WAL lag, latencies) are kept
in memory; GenAI metrics (token usage, operation durations, tool calls and errors) are computed
from the spans already in the store, so they describe what was recorded, whoever sent it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# gen_ai.client.operation.duration boundaries from the GenAI semantic conventions
GENAI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)

_HELP = {
    "agenttape_requests_total": ("counter", "OTLP export requests by transport, signal and response code."),
    "agenttape_spans_accepted_total": ("counter", "Spans acknowledged to clients (durable in the WAL)."),
    "agenttape_spans_rejected_total": ("counter", "Spans refused, by reason."),
    "agenttape_spans_stored_total": ("counter", "Spans newly written to the store."),
    "agenttape_spans_duplicate_total": ("counter", "Re-sent spans already in the store."),
    "agenttape_spans_conflicting_total": ("counter", "Re-sent span ids whose content differs from the stored span (not stored)."),
    "agenttape_queries_refused_total": ("counter", "POST /api/query requests refused (writes, files, bad SQL)."),
    "agenttape_queries_timed_out_total": ("counter", "Queries interrupted at the query timeout."),
    "agenttape_logs_accepted_total": ("counter", "Log records acknowledged to clients."),
    "agenttape_logs_rejected_total": ("counter", "Log records refused, by reason."),
    "agenttape_logs_stored_total": ("counter", "Log records written to the store."),
    "agenttape_backpressure_total": ("counter", "Requests refused because the ingest queue was full."),
    "agenttape_store_errors_total": ("counter", "Failed store writes (retried from the WAL)."),
    "agenttape_parquet_errors_total": ("counter", "Failed Parquet lake writes (DuckDB still holds the rows)."),
    "agenttape_requests_too_many_items_total": ("counter", "Requests refused for holding more spans (log records) than allowed."),
    "agenttape_http_refused_total": ("counter", "HTTP connections or requests cut off by a limit, by reason."),
    "agenttape_wal_replayed_records_total": ("counter", "WAL records applied at start."),
    "agenttape_ingest_latency_seconds": ("histogram", "Time from request received to acknowledgement."),
    "agenttape_store_write_seconds": ("histogram", "Duration of one batched store write."),
}


# The series a labelled counter shows before its first increment, so it keeps one identity over time.
_ZERO_SERIES: dict[str, tuple[tuple[str, Any], ...]] = {
    "agenttape_spans_rejected_total": (("reason", "invalid_id"),),
    "agenttape_logs_rejected_total": (("reason", "invalid_id"),),
}


def _esc(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, Any] | tuple[tuple[str, Any], ...]) -> str:
    items = labels.items() if isinstance(labels, dict) else labels
    inner = ",".join(f'{k}="{_esc(v)}"' for k, v in items)
    return "{" + inner + "}" if inner else ""


def _num(v: float) -> str:
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return "+Inf" if v > 0 else ("-Inf" if v < 0 else "NaN")
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(v) if isinstance(v, float) else str(v)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.total += 1
        self.sum += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
                break

    def lines(self, name: str) -> list[str]:
        out, acc = [], 0
        for b, c in zip(self.buckets, self.counts):
            acc += c
            out.append(f'{name}_bucket{{le="{_num(float(b))}"}} {acc}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.total}')
        out.append(f"{name}_sum {_num(self.sum)}")
        out.append(f"{name}_count {self.total}")
        return out


class Metrics:
    """Thread-safe counters, gauges and histograms of one receiver."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}
        self._hist: dict[str, _Histogram] = {
            "agenttape_ingest_latency_seconds": _Histogram(LATENCY_BUCKETS),
            "agenttape_store_write_seconds": _Histogram(LATENCY_BUCKETS),
        }
        self._rate_bytes = 0.0
        self._rate_at = time.monotonic()

    def inc(self, name: str, value: float = 1, **labels: Any) -> None:
        if not value:
            return
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0) + value

    def get(self, name: str, **labels: Any) -> float:
        """Current value of one counter series (0 when never incremented)."""
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0)

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            self._hist[name].observe(seconds)

    def record_store_batch(self, nbytes: int) -> None:
        """Track the store's recent throughput (bytes/s, decaying average) to size Retry-After."""
        now = time.monotonic()
        with self._lock:
            dt = max(now - self._rate_at, 1e-3)
            inst = nbytes / dt
            self._rate_bytes = inst if not self._rate_bytes else 0.7 * self._rate_bytes + 0.3 * inst
            self._rate_at = now

    def store_rate_bytes(self) -> float:
        return self._rate_bytes

    def render(self, gauges: dict[str, tuple[str, float]], genai: str = "") -> str:
        """Prometheus text format 0.0.4 of every series plus ``gauges`` {name: (help, value)}."""
        lines: list[str] = []
        with self._lock:
            by_name: dict[str, list[tuple[tuple[tuple[str, Any], ...], float]]] = {}
            for (name, labels), v in self._counters.items():
                by_name.setdefault(name, []).append((labels, v))
            for name, (typ, help_) in _HELP.items():
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {typ}")
                if typ == "histogram":
                    lines.extend(self._hist[name].lines(name))
                    continue
                series = by_name.get(name) or [(_ZERO_SERIES.get(name, ()), 0)]
                for labels, v in sorted(series, key=lambda s: s[0]):
                    lines.append(f"{name}{_labels(labels)} {_num(float(v))}")
        for name, (help_, value) in gauges.items():
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {_num(float(value))}")
        text = "\n".join(lines) + "\n"
        return text + genai


GENAI_SQL_TOKENS = """
SELECT coalesce(response_model, request_model, '') AS model,
       coalesce(sum(input_tokens), 0) AS input, coalesce(sum(output_tokens), 0) AS output
FROM spans WHERE input_tokens IS NOT NULL OR output_tokens IS NOT NULL
GROUP BY 1 ORDER BY 1
"""

GENAI_SQL_TOOLS = """
SELECT tool_name, count(*) AS calls, count(*) FILTER (WHERE status_code = 2) AS errors
FROM spans WHERE tool_name IS NOT NULL GROUP BY 1 ORDER BY 1
"""


def genai_duration_sql() -> str:
    cols = ", ".join(
        f"count(*) FILTER (WHERE d <= {b}) AS b{i}" for i, b in enumerate(GENAI_DURATION_BUCKETS)
    )
    return (
        "SELECT operation_name, count(*) AS n, coalesce(sum(d), 0) AS s, "
        + cols
        + " FROM (SELECT operation_name, (end_time_unix_nano - start_time_unix_nano) / 1e9 AS d"
        " FROM spans WHERE operation_name IS NOT NULL) GROUP BY 1 ORDER BY 1"
    )


def render_genai(query: Callable[[str], Any]) -> str:
    """GenAI metrics over the stored spans; ``query(sql)`` returns a pyarrow Table."""
    out: list[str] = []
    name = "agenttape_genai_token_usage_tokens_total"
    out += [f"# HELP {name} Tokens used by model and type (gen_ai.usage.* of stored spans).", f"# TYPE {name} counter"]
    for row in query(GENAI_SQL_TOKENS).to_pylist():
        for typ in ("input", "output"):
            out.append(f"{name}{_labels({'gen_ai_response_model': row['model'], 'gen_ai_token_type': typ})} {int(row[typ])}")
    name = "agenttape_genai_operation_duration_seconds"
    out += [f"# HELP {name} Duration of stored GenAI operation spans.", f"# TYPE {name} histogram"]
    for row in query(genai_duration_sql()).to_pylist():
        op = row["operation_name"]
        for i, b in enumerate(GENAI_DURATION_BUCKETS):
            out.append(f"{name}_bucket{_labels({'gen_ai_operation_name': op, 'le': _num(float(b))})} {int(row[f'b{i}'])}")
        out.append(f"{name}_bucket{_labels({'gen_ai_operation_name': op, 'le': '+Inf'})} {int(row['n'])}")
        out.append(f"{name}_sum{_labels({'gen_ai_operation_name': op})} {_num(float(row['s']))}")
        out.append(f"{name}_count{_labels({'gen_ai_operation_name': op})} {int(row['n'])}")
    calls, errors = "agenttape_genai_tool_calls_total", "agenttape_genai_tool_errors_total"
    rows = query(GENAI_SQL_TOOLS).to_pylist()
    out += [f"# HELP {calls} Stored tool call spans by tool.", f"# TYPE {calls} counter"]
    out += [f"{calls}{_labels({'gen_ai_tool_name': r['tool_name']})} {int(r['calls'])}" for r in rows]
    out += [f"# HELP {errors} Stored tool call spans with error status by tool.", f"# TYPE {errors} counter"]
    out += [f"{errors}{_labels({'gen_ai_tool_name': r['tool_name']})} {int(r['errors'])}" for r in rows]
    return "\n".join(out) + "\n"
