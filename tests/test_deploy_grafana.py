"""The dashboards in grafana/dashboards/: built by grafana/generate.py with the typed Grafana Foundation
SDK (the files are what it builds), read back by the SDK's dashboard model without loss, on the
provisioned data source only, every panel with a query and a link to the console."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from otel_agenttape.receiver.genai_metrics import SpanMetrics
from otel_agenttape.receiver.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))


def _generator():
    spec = importlib.util.spec_from_file_location("grafana_generate", GRAFANA / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _datasource_uid() -> str:
    prov = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "agenttape.yaml").read_text())
    (ds,) = prov["datasources"]
    assert ds["type"] == "prometheus"
    return ds["uid"]


def test_dashboard_files_are_what_the_generator_builds():
    gen = _generator()
    assert sorted(gen.render()) == [p.name for p in DASHBOARDS] == ["agent.json", "overview.json", "receiver.json"]
    for name, text in gen.render().items():
        assert (GRAFANA / "dashboards" / name).read_text() == text, f"{name} is stale: run python grafana/generate.py"
    assert gen.main(["--check"]) == 0


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_dashboard_reads_back_through_the_typed_model(path):
    data = json.loads(path.read_text())
    model = Dashboard.from_json(data)
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    gen = _generator()
    assert gen._drop_nulls(again) == data  # nothing in the file that the typed model does not hold
    assert data["uid"].startswith("agenttape-") and data["title"].startswith("agenttape / ")


def _datasource_refs(node, path="$"):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "datasource":
                yield path, v
            else:
                yield from _datasource_refs(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _datasource_refs(v, f"{path}[{i}]")


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_panels_use_the_provisioned_datasource_and_have_queries_and_links(path):
    uid = _datasource_uid()
    data = json.loads(path.read_text())
    refs = list(_datasource_refs(data))
    assert refs and all(ref == {"type": "prometheus", "uid": uid} for _, ref in refs), refs
    assert data["panels"]
    for panel in data["panels"]:
        assert panel["targets"], f"{panel['title']} has no query"
        assert all(t["expr"].strip() for t in panel["targets"])
        links = panel["fieldConfig"]["defaults"]["links"]
        assert len(links) == 1 and links[0]["url"].startswith("${console_url}/")
    names = [v["name"] for v in data["templating"]["list"]]
    assert names[0] == "console_url"
    if path.stem == "agent":
        assert names[1:] == ["agent", "model", "service"]


def test_dashboards_query_only_metrics_the_receiver_exposes():
    metrics = Metrics()
    metrics.add_collector(SpanMetrics())
    metrics.add_gauges(lambda: {n: ("", 0) for n in (
        "agenttape_ready", "agenttape_queue_bytes", "agenttape_queue_limit_bytes", "agenttape_queue_lag_seconds",
        "agenttape_wal_lag_records", "agenttape_wal_disk_bytes", "agenttape_store_bytes")})
    exposed = set()
    for fam in metrics.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(fam.type, [""])
        exposed |= {fam.name + s for s in suffixes}
    import re

    for path in DASHBOARDS:
        text = path.read_text()
        used = set(re.findall(r"\b((?:agenttape|gen_ai)_[a-z_]+?)(?=[{\[)\s,])", text))
        used -= {"gen_ai_agent_name", "gen_ai_request_model", "gen_ai_tool_name", "gen_ai_token_type",
                 "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_evaluation_name",
                 "gen_ai_evaluation_score_label", "agenttape_score_source"}  # label names, not metrics
        assert used and used <= exposed, f"{path.name}: not on /metrics: {sorted(used - exposed)}"


def test_dashboard_provider_points_at_the_folder_compose_mounts():
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "agenttape.yaml").read_text())
    (provider,) = prov["providers"]
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert any(m.endswith(":" + provider["options"]["path"] + ":ro") and "grafana/dashboards" in m for m in mounts)
