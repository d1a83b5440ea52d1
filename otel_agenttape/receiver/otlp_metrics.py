"""The same metrics as ``/metrics``, pushed over OTLP/HTTP to a collector.

A bridge, not a second set of instruments: every ``interval`` seconds it reads the server's
``prometheus_client`` registry, turns each family into OpenTelemetry metric data (counters as
cumulative monotonic sums, gauges as gauges, histograms as cumulative explicit-bucket histograms)
and hands it to the OpenTelemetry SDK's ``OTLPMetricExporter``. Names go back to their OTel form:
``gen_ai_client_token_usage`` is sent as ``gen_ai.client.token.usage`` (unit ``{token}``), a
``*_seconds`` family as its base name with unit ``s``, a counter without its ``_total``, labels such
as ``gen_ai_request_model`` as ``gen_ai.request.model``. A collector exporting them to Prometheus
renders the same names and labels that ``/metrics`` shows.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_agenttape import semconv

log = logging.getLogger(__name__)

SCOPE = InstrumentationScope(semconv.SCOPE_RECEIVER)
# Prometheus family -> (OTel name, unit) where the GenAI conventions name the metric
_OTEL_NAMES = {
    "gen_ai_client_token_usage": ("gen_ai.client.token.usage", "{token}"),
    "gen_ai_client_operation_duration_seconds": ("gen_ai.client.operation.duration", "s"),
    "gen_ai_client_operation_time_to_first_chunk_seconds": ("gen_ai.client.operation.time_to_first_chunk", "s"),
}
_OTEL_LABELS = {
    "gen_ai_operation_name": "gen_ai.operation.name", "gen_ai_provider_name": "gen_ai.provider.name",
    "gen_ai_request_model": "gen_ai.request.model", "gen_ai_response_model": "gen_ai.response.model",
    "gen_ai_token_type": "gen_ai.token.type", "gen_ai_agent_name": "gen_ai.agent.name",
    "gen_ai_tool_name": "gen_ai.tool.name", "error_type": "error.type", "service_name": "service.name",
}


def metrics_url(endpoint: str) -> str:
    """``endpoint`` as given when it has a path, else ``<endpoint>/v1/metrics`` (the OTLP default path)."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--metrics-otlp-endpoint must be an http(s) URL, got {endpoint!r}")
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/metrics"
    return endpoint


def _name_unit(family: Any) -> tuple[str, str]:
    if family.name in _OTEL_NAMES:
        return _OTEL_NAMES[family.name]
    if family.name.endswith("_seconds"):
        return family.name[: -len("_seconds")], "s"
    return family.name, ""


def _attrs(labels: dict[str, str]) -> dict[str, str]:
    return {_OTEL_LABELS.get(k, k): v for k, v in labels.items() if k != "le" and v != ""}


def to_metrics_data(registry: Any, start_ns: int, resource: Resource) -> MetricsData:
    """One snapshot of ``registry`` (anything with ``collect()``: ``Metrics``, a registry) as OpenTelemetry
    metric data."""
    now = time.time_ns()
    out: list[Metric] = []
    for fam in registry.collect():
        name, unit = _name_unit(fam)
        if fam.type == "counter":
            points = [NumberDataPoint(_attrs(s.labels), start_ns, now, s.value)
                      for s in fam.samples if s.name.endswith("_total")]
            data: Any = Sum(points, AggregationTemporality.CUMULATIVE, True)
        elif fam.type == "gauge":
            data = Gauge([NumberDataPoint(_attrs(s.labels), start_ns, now, s.value) for s in fam.samples])
        elif fam.type == "histogram":
            data = Histogram(_histogram_points(fam, start_ns, now), AggregationTemporality.CUMULATIVE)
        else:
            data = Gauge([NumberDataPoint(_attrs(s.labels), start_ns, now, s.value) for s in fam.samples])
        if data.data_points:
            out.append(Metric(name, fam.documentation, unit, data))
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(SCOPE, out, "")], "")])


def _histogram_points(fam: Any, start_ns: int, now: int) -> list[HistogramDataPoint]:
    series: dict[tuple, dict[str, Any]] = {}
    for s in fam.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        d = series.setdefault(key, {"buckets": [], "sum": 0.0, "count": 0})
        if s.name.endswith("_bucket"):
            d["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_sum"):
            d["sum"] = s.value
        elif s.name.endswith("_count"):
            d["count"] = int(s.value)
    points = []
    for key, d in series.items():
        cum = sorted(d["buckets"])
        bounds = [b for b, _ in cum if not math.isinf(b)]
        counts, prev = [], 0.0
        for _, c in cum:
            counts.append(int(c - prev))
            prev = c
        points.append(HistogramDataPoint(_attrs(dict(key)), start_ns, now, d["count"], d["sum"], counts, bounds,
                                         None, None))  # type: ignore[arg-type]  # min/max unknown: not sent
    return points


class OtlpMetricsBridge:
    """Exports a registry every ``interval`` seconds over OTLP/HTTP (protobuf), and once more at stop."""

    def __init__(self, registry: Any, endpoint: str, interval: float = 15.0, timeout: float = 10.0,
                 service_name: str = "agenttape") -> None:
        self.registry = registry
        self.url = metrics_url(endpoint)
        self.interval = max(0.1, float(interval))
        self.exporter = OTLPMetricExporter(endpoint=self.url, timeout=timeout)
        self.resource = Resource.create({"service.name": service_name})
        self.start_ns = time.time_ns()
        self.exports = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def export_once(self) -> bool:
        try:
            result = self.exporter.export(to_metrics_data(self.registry, self.start_ns, self.resource))
        except Exception as exc:  # noqa: BLE001 - a collector that is down must not stop the receiver
            log.warning("OTLP metrics export to %s failed: %s", self.url, exc)
            result = MetricExportResult.FAILURE
        ok = result == MetricExportResult.SUCCESS
        self.exports += ok
        self.failures += not ok
        if hasattr(self.registry, "inc"):  # the server's Metrics: count pushes on /metrics too
            self.registry.inc("agenttape_metrics_otlp_exports_total", 1, result="ok" if ok else "failed")
        return ok

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agenttape-otlp-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.export_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 15)
            self._thread = None
        self.export_once()
        try:
            self.exporter.shutdown()
        except Exception:  # noqa: BLE001 - shutting down a failed exporter
            pass
