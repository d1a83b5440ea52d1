"""The receiver's metrics registry and the text of ``GET /metrics``.

Each ``TapeServer`` has its own ``prometheus_client`` registry (``Metrics.registry``), so two servers
in one process (tests, the demo) never share series. The receiver's counters are kept in a dict and
read by a custom collector at scrape time, so any module can count something new with
``metrics.inc("agenttape_..._total", n, label=value)`` without declaring it first (a name listed in
``_HELP`` gets its help text there). Gauges whose value lives elsewhere (queue, WAL, store size) are
read on scrape through ``add_gauges``; the metrics derived from ingested spans are a collector of
their own (``genai_metrics.SpanMetrics``) added with ``add_collector``. Exposition is
``prometheus_client.generate_latest``: text format 0.0.4.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# gen_ai.client.operation.duration boundaries from the GenAI semantic conventions
GENAI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)

# counters: name -> help. A counter incremented under another name is still exposed (help "agenttape counter").
_HELP: dict[str, str] = {
    "agenttape_requests_total": "OTLP export requests by transport, signal and response code.",
    "agenttape_spans_accepted_total": "Spans acknowledged to clients (durable in the WAL).",
    "agenttape_spans_rejected_total": "Spans refused, by reason.",
    "agenttape_spans_stored_total": "Spans newly written to the store.",
    "agenttape_spans_duplicate_total": "Re-sent spans already in the store.",
    "agenttape_logs_accepted_total": "Log records acknowledged to clients.",
    "agenttape_logs_rejected_total": "Log records refused, by reason.",
    "agenttape_logs_stored_total": "Log records written to the store.",
    "agenttape_backpressure_total": "Requests refused because the ingest queue was full.",
    "agenttape_store_errors_total": "Failed store writes (retried from the WAL).",
    "agenttape_store_written_bytes_total": "Bytes of Arrow rows written to the store.",
    "agenttape_parquet_errors_total": "Failed Parquet lake writes (DuckDB still holds the rows).",
    "agenttape_wal_replayed_records_total": "WAL records applied at start.",
    "agenttape_metrics_errors_total": "Stored batches whose metrics could not be derived.",
    "agenttape_spans_conflicting_total": "Re-sent span ids whose content differs from the stored span (not stored).",
    "agenttape_queries_refused_total": "POST /api/query requests refused (writes, files, bad SQL).",
    "agenttape_queries_timed_out_total": "Queries interrupted at the query timeout.",
    "agenttape_requests_too_many_items_total": "Requests refused for holding more spans (log records) than allowed.",
    "agenttape_http_refused_total": "HTTP connections or requests cut off by a limit, by reason.",
    "agenttape_quiet_releases_total": "Quiet spells after which idle memory was given back (converters, cached blocks).",
    "agenttape_quiet_released_store_bytes_total": "Bytes of cached store blocks given back after quiet spells.",
    "agenttape_quiet_released_read_bytes_total": "Bytes of the read model's kept reads let go after quiet spells.",
    "agenttape_quiet_released_code_bytes_total": "Bytes of resident library pages handed back to the kernel after quiet spells.",
}

_HISTOGRAMS: dict[str, str] = {
    "agenttape_ingest_latency_seconds": "Time from request received to acknowledgement.",
    "agenttape_store_write_seconds": "Duration of one batched store write.",
}

# The series a labelled counter shows before its first increment, so it keeps one identity over time.
_ZERO_SERIES: dict[str, tuple[tuple[str, Any], ...]] = {
    "agenttape_spans_rejected_total": (("reason", "invalid_id"),),
    "agenttape_logs_rejected_total": (("reason", "invalid_id"),),
}

GaugeSource = Callable[[], dict[str, tuple[str, float]]]


class _Counters(Collector):
    """Exposes ``Metrics``' counter dict on scrape."""

    def __init__(self, owner: Metrics) -> None:
        self.owner = owner

    def collect(self) -> Iterable[Metric]:
        series = self.owner.counter_series()
        names = list(_HELP) + sorted(n for n in series if n not in _HELP)
        for name in names:
            rows = series.get(name) or [(_ZERO_SERIES.get(name, ()), 0.0)] if name in _HELP else series[name]
            keys = sorted({k for labels, _ in rows for k, _ in labels})
            help_ = _HELP.get(name, "agenttape counter")
            if name.endswith("_total"):
                fam: Metric = CounterMetricFamily(name[: -len("_total")], help_, labels=keys)
            else:
                fam = UnknownMetricFamily(name, help_, labels=keys)
            for labels, value in sorted(rows, key=lambda r: r[0]):
                d = dict(labels)
                fam.add_metric([str(d.get(k, "")) for k in keys], value)
            yield fam


class _Gauges(Collector):
    """Gauges read from their owner at scrape time: ``source()`` returns {name: (help, value)}."""

    def __init__(self, source: GaugeSource) -> None:
        self.source = source

    def collect(self) -> Iterable[Metric]:
        for name, (help_, value) in self.source().items():
            yield GaugeMetricFamily(name, help_, value=float(value))


class Metrics:
    """Thread-safe counters, gauges and histograms of one receiver, in a registry of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Counters(self))
        self._hist = {name: Histogram(name[: -len("_seconds")], help_, unit="seconds", buckets=LATENCY_BUCKETS,
                                      registry=self.registry)
                      for name, help_ in _HISTOGRAMS.items()}
        self._text_sources: list[Any] = []
        self._rate_bytes = 0.0
        self._rate_at = time.monotonic()

    def inc(self, name: str, value: float = 1, **labels: Any) -> None:
        """Add ``value`` to the counter series ``name{labels}`` (created on first use)."""
        if not value:
            return
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0) + value

    def get(self, name: str, **labels: Any) -> float:
        """Current value of one counter series (0 when never incremented)."""
        with self._lock:
            return self._counters.get((name, tuple(sorted(labels.items()))), 0)

    def counter_series(self) -> dict[str, list[tuple[tuple[tuple[str, Any], ...], float]]]:
        """A copy of every counter series, grouped by name."""
        with self._lock:
            items = list(self._counters.items())
        out: dict[str, list[tuple[tuple[tuple[str, Any], ...], float]]] = {}
        for (name, labels), v in items:
            out.setdefault(name, []).append((labels, v))
        return out

    def observe(self, name: str, seconds: float) -> None:
        """One observation of a receiver latency histogram (``_HISTOGRAMS``)."""
        self._hist[name].observe(seconds)

    def add_gauges(self, source: GaugeSource) -> None:
        """Expose the gauges ``source()`` returns, read at each scrape."""
        self.registry.register(_Gauges(source))

    def add_collector(self, collector: Collector) -> None:
        """Expose ``collector``'s families. One with ``render_text()`` (the span metrics) renders itself,
        caching the text of series that did not change; the rest go through the registry."""
        if hasattr(collector, "render_text"):
            self._text_sources.append(collector)
        else:
            self.registry.register(collector)

    def collect(self) -> Iterable[Metric]:
        """Every family, as ``prometheus_client`` metric families (for the OTLP bridge)."""
        yield from self.registry.collect()
        for source in self._text_sources:
            yield from source.collect()

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

    def render(self, gauges: dict[str, tuple[str, float]] | None = None) -> str:
        """Prometheus text format 0.0.4 of every series, plus ``gauges`` {name: (help, value)} if given."""
        text = generate_latest(self.registry).decode("utf-8")
        text += "".join(source.render_text() for source in self._text_sources)
        if gauges:
            reg = CollectorRegistry(auto_describe=False)
            reg.register(_Gauges(lambda: gauges))
            text += generate_latest(reg).decode("utf-8")
        return text
