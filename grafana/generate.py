"""Build the Grafana dashboards of ``grafana/dashboards/`` with the typed Grafana Foundation SDK.

    python grafana/generate.py          # rewrite grafana/dashboards/*.json
    python grafana/generate.py --check  # exit 1 if a file differs from what this script builds

Every panel queries the provisioned Prometheus data source (uid ``agenttape-prometheus``) and only
metric names that ``agenttape serve`` exposes on ``/metrics``. Every panel links to the console's runs
list filtered like the series clicked: ``${console_url}/?agent=..&model=..&service=..&status=..&tool=..``,
each parameter taken from a label the panel's query keeps (``by (...)``), so a link names exactly
the agent, model, service, status or tool of that series.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh, VariableSort

DATASOURCE_UID = "agenttape-prometheus"
DS = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
OUT = Path(__file__).resolve().parent / "dashboards"
# console query parameter -> the metric label it is read from
LINK_PARAMS = {"agent": "gen_ai_agent_name", "model": "gen_ai_request_model", "service": "service_name",
               "status": "status", "tool": "gen_ai_tool_name"}
RATE = "$__rate_interval"
RANGE = "$__range"
DRILL = 'gen_ai_agent_name=~"$agent", service_name=~"$service"'
DRILL_MODEL = DRILL + ', gen_ai_request_model=~"$model"'


@dataclass
class P:
    """One panel: its kind, title, queries (expr, legend), unit, and the console parameters its links set."""

    kind: str
    title: str
    targets: list[tuple[str, str]]
    unit: str = "short"
    link: tuple[str, ...] = ()
    description: str = ""
    w: int = 12
    h: int = 8
    extra: dict = field(default_factory=dict)


def console_link(params: tuple[str, ...]) -> dashboard.DashboardLink:
    query = "&".join(f"{p}=${{__field.labels.{LINK_PARAMS[p]}:percentencode}}" for p in params)
    url = "${console_url}/" + (f"?{query}" if query else "")
    title = "Runs in the console" + (f" (by {', '.join(params)})" if params else "")
    return dashboard.DashboardLink(title).url(url).target_blank(True)


def build_panel(spec: P, pid: int) -> object:
    mod = {"timeseries": timeseries, "stat": stat, "bargauge": bargauge, "table": table}[spec.kind]
    panel = mod.Panel().id(pid).title(spec.title).datasource(DS).unit(spec.unit).span(spec.w).height(spec.h)
    if spec.description:
        panel = panel.description(spec.description)
    for i, (expr, legend) in enumerate(spec.targets):
        q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).datasource(DS)
        if spec.kind in ("stat", "bargauge", "table"):
            q = q.instant()
        else:
            q = q.range()
        panel = panel.with_target(q)
    return panel.data_links([console_link(spec.link)])


def textbox_console() -> object:
    return (dashboard.TextBoxVariable("console_url").label("Console URL")
            .description("Where `agenttape serve` (or `agenttape console`) serves the console")
            .default_value("http://localhost:8080")
            .current(VariableOption(text="http://localhost:8080", value="http://localhost:8080")))


def query_var(name: str, label: str, metric: str, label_name: str) -> object:
    return (dashboard.QueryVariable(name).label(label).datasource(DS)
            .query(f"label_values({metric}, {label_name})")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .include_all(True).all_value(".*").multi(False)
            .current(VariableOption(text="All", value="$__all")))


def build(uid: str, title: str, description: str, panels: list[P], variables: list[object], tags: list[str]) -> dict:
    d = (dashboard.Dashboard(title).uid(uid).description(description).tags(tags).time("now-1h", "now")
         .refresh("30s").timezone("browser").editable())
    for v in [textbox_console(), *variables]:
        d = d.with_variable(v)
    for i, spec in enumerate(panels, start=1):
        d = d.with_panel(build_panel(spec, i))
    return _drop_nulls(json.loads(json.dumps(d.build(), cls=JSONEncoder)))


def _drop_nulls(value: object) -> object:
    """Unset fields are left out rather than written as null (Grafana then uses its defaults)."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def q(quantile: float, metric: str, by: str, sel: str = "") -> str:
    return (f"histogram_quantile({quantile}, sum by (le, {by}) "
            f"(rate({metric}_bucket{{{sel}}}[{RATE}])))")


def ratio_or_zero(num: str, den: str, by: str) -> str:
    """num/den per group, 0 (not absent) where num has no series: an error rate that shows 0 errors."""
    return f"(sum by ({by}) ({num}) or (sum by ({by}) ({den}) * 0)) / sum by ({by}) ({den})"


def overview() -> dict:
    dur = "gen_ai_client_operation_duration_seconds"
    calls = f"rate({dur}_count[{RATE}])"
    errs = f'rate({dur}_count{{error_type!=""}}[{RATE}])'
    panels = [
        P("timeseries", "Model calls per second by model", [
            (f"sum by (gen_ai_request_model) ({calls})", "{{gen_ai_request_model}}")], "reqps", ("model",)),
        P("timeseries", "OTLP requests per second (receiver)", [
            (f"sum by (signal, code) (rate(agenttape_requests_total[{RATE}]))", "{{signal}} {{code}}")], "reqps"),
        P("timeseries", "Tokens per second by model and type (multiply by your price per token)", [
            (f"sum by (gen_ai_request_model, gen_ai_token_type) (rate(gen_ai_client_token_usage_sum[{RATE}]))",
             "{{gen_ai_request_model}} {{gen_ai_token_type}}")], "short", ("model",)),
        P("timeseries", "Cost per hour (USD) by agent and model", [
            (f"3600 * sum by (gen_ai_agent_name, gen_ai_request_model) "
             f"(rate(agenttape_gen_ai_cost_usd_total[{RATE}]))", "{{gen_ai_agent_name}} {{gen_ai_request_model}}")],
          "currencyUSD", ("agent", "model"),
          "Priced at ingest from genai-prices and the receiver's AGENTTAPE_PRICES overrides."),
        P("table", "Cost in the time range (USD) by service and model", [
            (f"sum by (service_name, gen_ai_request_model) (increase(agenttape_gen_ai_cost_usd_total[{RANGE}]))",
             "{{service_name}} {{gen_ai_request_model}}")], "currencyUSD", ("service", "model")),
        P("table", "Model calls without a price in the time range (their cost is unknown)", [
            (f"sum by (gen_ai_request_model) (increase(agenttape_gen_ai_unpriced_calls_total[{RANGE}])) or "
             f"sum by (gen_ai_request_model) (increase({dur}_count[{RANGE}])) * 0", "{{gen_ai_request_model}}")],
          "short", ("model",), "Give such models a price with AGENTTAPE_PRICES (per-model prices per million tokens)."),
        P("table", "Scores in the time range by evaluation, label and who gave them", [
            (f"sum by (gen_ai_evaluation_name, gen_ai_evaluation_score_label, agenttape_score_source) "
             f"(increase(agenttape_evaluation_scores_total[{RANGE}]))",
             "{{gen_ai_evaluation_name}} {{gen_ai_evaluation_score_label}} {{agenttape_score_source}}")], "short", (),
          "gen_ai.evaluation.result events: evaluators, people's annotations, other instrumentations' judges."),
        P("stat", "Mean score by evaluation (since the receiver started)", [
            ("sum by (gen_ai_evaluation_name) (agenttape_evaluation_score_value_sum) / "
             "sum by (gen_ai_evaluation_name) (agenttape_evaluation_score_value_count)", "{{gen_ai_evaluation_name}}")],
          "short", ()),
        P("table", "Failed evaluations in the time range by evaluation and error type", [
            (f'sum by (gen_ai_evaluation_name, error_type) (increase(agenttape_evaluation_scores_total{{error_type!=""}}[{RANGE}])) '
             f"or sum by (gen_ai_evaluation_name) (increase(agenttape_evaluation_scores_total[{RANGE}])) * 0",
             "{{gen_ai_evaluation_name}} {{error_type}}")], "short", (),
          "A judge that timed out or answered garbage records error.type, never a score."),
        P("table", "Tokens in the time range by model", [
            (f"sum by (gen_ai_request_model, gen_ai_token_type) (increase(gen_ai_client_token_usage_sum[{RANGE}]))",
             "{{gen_ai_request_model}} {{gen_ai_token_type}}")], "short", ("model",)),
        P("timeseries", "Model call latency p50 / p95", [
            (q(0.5, dur, "gen_ai_request_model"), "p50 {{gen_ai_request_model}}"),
            (q(0.95, dur, "gen_ai_request_model"), "p95 {{gen_ai_request_model}}")], "s", ("model",)),
        P("timeseries", "Model call error rate", [
            (ratio_or_zero(errs, calls, "gen_ai_request_model"), "{{gen_ai_request_model}}")], "percentunit",
          ("model",)),
        P("timeseries", "Tool error rate by tool", [
            (ratio_or_zero(f"rate(agenttape_tool_errors_total[{RATE}])", f"rate(agenttape_tool_calls_total[{RATE}])",
                           "gen_ai_tool_name"), "{{gen_ai_tool_name}}")], "percentunit", ("tool",)),
        P("bargauge", "Top tools (calls in the time range)", [
            (f"topk(10, sum by (gen_ai_tool_name) (increase(agenttape_tool_calls_total[{RANGE}])))",
             "{{gen_ai_tool_name}}")], "short", ("tool",)),
        P("bargauge", "Runs by status (time range)", [
            (f"sum by (status) (increase(agenttape_runs_total[{RANGE}]))", "{{status}}")], "short", ("status",)),
        P("timeseries", "Runs per second by agent", [
            (f"sum by (gen_ai_agent_name) (rate(agenttape_runs_total[{RATE}]))", "{{gen_ai_agent_name}}")],
          "short", ("agent",)),
    ]
    return build("agenttape-overview", "agenttape / Overview",
                 "Model calls, tokens, latency, errors, tools and runs of every agent the receiver stored.",
                 panels, [], ["agenttape"])


def agent() -> dict:
    dur = "gen_ai_client_operation_duration_seconds"
    by_m = "gen_ai_request_model, gen_ai_agent_name, service_name"
    by_t = "gen_ai_tool_name, gen_ai_agent_name, service_name"
    by_a = "gen_ai_agent_name, service_name"
    panels = [
        P("bargauge", "Runs by status", [
            (f"sum by (status, {by_a}) (increase(agenttape_runs_total{{{DRILL}}}[{RANGE}]))",
             "{{gen_ai_agent_name}} {{status}}")], "short", ("agent", "service", "status")),
        P("timeseries", "Run duration p50 / p95", [
            (q(0.5, "agenttape_run_duration_seconds", by_a, DRILL), "p50 {{gen_ai_agent_name}}"),
            (q(0.95, "agenttape_run_duration_seconds", by_a, DRILL), "p95 {{gen_ai_agent_name}}")], "s",
          ("agent", "service")),
        P("stat", "Steps per run (mean over the time range)", [
            (f"sum by ({by_a}) (increase(agenttape_run_steps_sum{{{DRILL}}}[{RANGE}])) / "
             f"sum by ({by_a}) (increase(agenttape_run_steps_count{{{DRILL}}}[{RANGE}]))", "{{gen_ai_agent_name}}")],
          "short", ("agent", "service")),
        P("timeseries", "Tokens per second by model and type", [
            (f"sum by (gen_ai_token_type, {by_m}) (rate(gen_ai_client_token_usage_sum{{{DRILL_MODEL}}}[{RATE}]))",
             "{{gen_ai_request_model}} {{gen_ai_token_type}}")], "short", ("agent", "model", "service")),
        P("timeseries", "Cost per hour (USD) by model", [
            (f"3600 * sum by ({by_m}) (rate(agenttape_gen_ai_cost_usd_total{{{DRILL_MODEL}}}[{RATE}]))",
             "{{gen_ai_request_model}}")], "currencyUSD", ("agent", "model", "service")),
        P("timeseries", "Model call latency p50 / p95", [
            (q(0.5, dur, by_m, DRILL_MODEL), "p50 {{gen_ai_request_model}}"),
            (q(0.95, dur, by_m, DRILL_MODEL), "p95 {{gen_ai_request_model}}")], "s", ("agent", "model", "service")),
        P("timeseries", "Time to first chunk p50 / p95 (streamed calls)", [
            (q(0.5, "gen_ai_client_operation_time_to_first_chunk_seconds", by_m, DRILL_MODEL), "p50 {{gen_ai_request_model}}"),
            (q(0.95, "gen_ai_client_operation_time_to_first_chunk_seconds", by_m, DRILL_MODEL),
             "p95 {{gen_ai_request_model}}")], "s", ("agent", "model", "service")),
        P("table", "Model calls by outcome (error type) in the time range", [
            (f"sum by (error_type, {by_m}) (increase({dur}_count{{{DRILL_MODEL}}}[{RANGE}]))",
             "{{gen_ai_request_model}} {{error_type}}")], "short", ("agent", "model", "service")),
        P("timeseries", "Tool calls per second by tool", [
            (f"sum by ({by_t}) (rate(agenttape_tool_calls_total{{{DRILL}}}[{RATE}]))", "{{gen_ai_tool_name}}")],
          "short", ("agent", "tool", "service")),
        P("table", "Tool errors by tool and error type (time range)", [
            (f"sum by (error_type, {by_t}) (increase(agenttape_tool_errors_total{{{DRILL}}}[{RANGE}]))",
             "{{gen_ai_tool_name}} {{error_type}}")], "short", ("agent", "tool", "service")),
        P("timeseries", "Tool duration p95 by tool", [
            (q(0.95, "agenttape_tool_duration_seconds", by_t, DRILL), "{{gen_ai_tool_name}}")], "s",
          ("agent", "tool", "service")),
    ]
    variables = [
        query_var("agent", "Agent", "agenttape_runs_total", "gen_ai_agent_name"),
        query_var("model", "Model", "gen_ai_client_operation_duration_seconds_count", "gen_ai_request_model"),
        query_var("service", "Service", "agenttape_runs_total", "service_name"),
    ]
    return build("agenttape-agent", "agenttape / Agent drill-down",
                 "One agent (or all), its models and services: runs, steps, tokens, latency, tools, errors.",
                 panels, variables, ["agenttape"])


def receiver() -> dict:
    sel = 'instance=~"$instance"'
    panels = [
        P("stat", "Ready receivers", [(f"sum(agenttape_ready{{{sel}}})", "ready")], "short"),
        P("timeseries", "OTLP requests per second by signal and code", [
            (f"sum by (signal, code) (rate(agenttape_requests_total{{{sel}}}[{RATE}]))", "{{signal}} {{code}}")],
          "reqps"),
        P("timeseries", "Spans per second: accepted, stored, duplicates", [
            (f"sum(rate(agenttape_spans_accepted_total{{{sel}}}[{RATE}]))", "accepted"),
            (f"sum(rate(agenttape_spans_stored_total{{{sel}}}[{RATE}]))", "stored"),
            (f"sum(rate(agenttape_spans_duplicate_total{{{sel}}}[{RATE}]))", "duplicate")], "short"),
        P("timeseries", "Spans rejected per second by reason", [
            (f"sum by (reason) (rate(agenttape_spans_rejected_total{{{sel}}}[{RATE}]))", "{{reason}}")], "short"),
        P("timeseries", "Queue and WAL lag", [
            (f"max(agenttape_queue_lag_seconds{{{sel}}})", "oldest unstored request (s)"),
            (f"sum(agenttape_wal_lag_records{{{sel}}})", "WAL records not applied")], "short"),
        P("timeseries", "Queue bytes against the limit", [
            (f"sum(agenttape_queue_bytes{{{sel}}})", "queued"),
            (f"sum(agenttape_queue_limit_bytes{{{sel}}})", "limit")], "bytes"),
        P("timeseries", "Store and WAL size on disk", [
            (f"sum(agenttape_store_bytes{{{sel}}})", "store"),
            (f"sum(agenttape_wal_disk_bytes{{{sel}}})", "WAL")], "bytes"),
        P("timeseries", "Ingest latency and store write p95", [
            (f"histogram_quantile(0.95, sum by (le) (rate(agenttape_ingest_latency_seconds_bucket{{{sel}}}[{RATE}])))",
             "ingest p95"),
            (f"histogram_quantile(0.95, sum by (le) (rate(agenttape_store_write_seconds_bucket{{{sel}}}[{RATE}])))",
             "store write p95")], "s"),
        P("timeseries", "Refusals and failures per second", [
            (f"sum(rate(agenttape_backpressure_total{{{sel}}}[{RATE}]))", "backpressure (429)"),
            (f"sum(rate(agenttape_store_errors_total{{{sel}}}[{RATE}]))", "store errors"),
            (f"sum(rate(agenttape_parquet_errors_total{{{sel}}}[{RATE}]))", "parquet errors")], "short"),
        P("bargauge", "Chain verification failures by reason (time range)", [
            (f"sum by (reason) (increase(agenttape_chain_verification_failures_total{{{sel}}}[{RANGE}]))",
             "{{reason}}")], "short"),
    ]
    variables = [query_var("instance", "Receiver", "agenttape_ready", "instance")]
    return build("agenttape-receiver", "agenttape / Receiver health",
                 "Requests, spans, refusals, queue and WAL lag, store size and latency of each receiver.",
                 panels, variables, ["agenttape"])


DASHBOARDS = {"overview.json": overview, "agent.json": agent, "receiver.json": receiver}


def render() -> dict[str, str]:
    return {name: json.dumps(fn(), indent=2, sort_keys=True) + "\n" for name, fn in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a dashboard file is not what this script builds")
    args = ap.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python grafana/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
