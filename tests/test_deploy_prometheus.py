"""Every panel of every dashboard in grafana/dashboards/, run as PromQL by a real Prometheus (Debian's
/usr/bin/prometheus) on 127.0.0.1 that scrapes a real `agenttape serve` which the demo agents fed.

Each query must return series, and each series must carry the labels the panel's console link
reads (so a click opens the runs of exactly that agent, model, service, status or tool).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
from receiver_util import free_env

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
LINK_LABELS = {"agent": "gen_ai_agent_name", "model": "gen_ai_request_model", "service": "service_name",
               "status": "status", "tool": "gen_ai_tool_name"}

pytestmark = pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="Debian's prometheus package is not installed "
                                                                     "(.ci/run installs it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(prometheus URL, values seen per label): agenttape serve fed by the demo, scraped every second."""
    tmp = tmp_path_factory.mktemp("prom")
    # the demo's model is self-hosted: the receiver prices it from an override file, as a team would
    (tmp / "prices.yaml").write_text("demo-model-1:\n  input_mtok: 0.5\n  output_mtok: 1.5\n")
    serve = subprocess.Popen([sys.executable, "-m", "otel_agenttape", "serve", "--db", str(tmp / "t.duckdb"),
                              "--http-port", "0", "--grpc-port", "0", "--ingest-workers", "0", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**free_env(), "AGENTTAPE_PRICES": str(tmp / "prices.yaml")})
    prom = None
    try:
        info = json.loads(serve.stdout.readline())
        from otel_agenttape.capture.setup import setup
        from otel_agenttape.demo import run_demo_agents

        tape = setup(endpoint=info["url"], protocol="http/protobuf", service_name="agenttape-demo")
        try:
            demo = run_demo_agents(tape)
            # feedback on the demo: a person's thumbs-up afterwards, an evaluator's value and a judge that failed
            assert tape.score(demo["run_id"], "thumbs", label="up")
            assert tape.score(demo["run_id"], "helpfulness", 0.8, source="code")
            assert tape.score(demo["run_id"], "judge", source="llm", error_type="timeout")
        finally:
            tape.shutdown()
        target = urlsplit(info["url"]).netloc
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: agenttape\n    static_configs: [{{targets: ['{target}']}}]\n")
        port = _free_port()
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:  # ready, and at least three scrapes of the receiver after the demo was stored
            try:
                r = httpx.get(f"{url}/api/v1/query", params={"query": "count_over_time(agenttape_runs_total[1m])"})
                res = r.json()["data"]["result"] if r.status_code == 200 else []
                if res and min(float(x["value"][1]) for x in res) >= 3:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)
        yield url
    finally:
        if prom is not None:
            _stop(prom)
        _stop(serve)


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.extend(p.get("panels", [])) if p.get("type") == "row" else out.append(p)
    return out


def _substitute(expr: str, values: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "5m").replace("$__interval", "15s")
    return re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)


def _link_labels(panel: dict) -> list[str]:
    labels = []
    for link in panel["fieldConfig"]["defaults"]["links"]:
        for param, value in parse_qsl(urlsplit(link["url"].replace("${console_url}", "http://c")).query):
            assert param in LINK_LABELS, f"{panel['title']}: console has no filter {param!r}"
            assert value == f"${{__field.labels.{LINK_LABELS[param]}:percentencode}}", (panel["title"], value)
            labels.append(LINK_LABELS[param])
    return labels


def _query(url: str, expr: str) -> list[dict]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    assert body["data"]["resultType"] == "vector"
    return body["data"]["result"]


def _variable_values(url: str, dash: dict) -> dict[str, list[str]]:
    """Each query variable's values, from its label_values(metric, label) query through Prometheus."""
    out = {}
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((\w+), (\w+)\)", v["query"])
        assert m, v["query"]
        r = httpx.get(f"{url}/api/v1/label/{m.group(2)}/values", params={"match[]": m.group(1)})
        values = r.json()["data"]
        assert values, f"variable {v['name']} has no values"
        out[v["name"]] = values
    return out


# the values a user would pick in the drill-down: the demo's researcher calls tools and a model
PICK = {"agent": "researcher", "model": "demo-model-1", "service": "agenttape-demo"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_every_panel_query_returns_series_with_its_link_labels(stack, path):
    dash = json.loads(path.read_text())
    variables = _variable_values(stack, dash)
    choices = [{name: ".*" for name in variables}]  # "All"
    choices.append({name: (PICK[name] if PICK.get(name) in vals else vals[0]) for name, vals in variables.items()})
    for picked in choices:
        for name, val in picked.items():
            assert val == ".*" or val in variables[name]
        for panel in _panels(dash):
            want = _link_labels(panel)
            assert panel["targets"], f"{panel['title']} has no query"
            for target in panel["targets"]:
                expr = _substitute(target["expr"], picked)
                result = _query(stack, expr)
                assert result, f"{path.name}: {panel['title']!r} returned no series for {expr}"
                for series in result:
                    missing = [lab for lab in want if not series["metric"].get(lab)]
                    assert not missing, f"{panel['title']!r}: series {series['metric']} lacks {missing}"
                    if picked.get("agent", ".*") != ".*" and "gen_ai_agent_name" in want:
                        assert series["metric"]["gen_ai_agent_name"] == picked["agent"]


def test_drill_down_values_are_those_of_the_demo(stack):
    dash = json.loads((ROOT / "grafana" / "dashboards" / "agent.json").read_text())
    values = _variable_values(stack, dash)
    assert sorted(values["agent"]) == ["coordinator", "critic", "researcher"]
    assert values["model"] == ["demo-model-1"] and values["service"] == ["agenttape-demo"]
    # the numbers behind two panels match what the demo did: 3 completed runs, 1 failed tool call
    runs = _query(stack, 'sum by (status) (agenttape_runs_total{gen_ai_agent_name=~".*"})')
    assert [(r["metric"]["status"], r["value"][1]) for r in runs] == [("completed", "3")]
    errors = _query(stack, "sum by (gen_ai_tool_name, error_type) (agenttape_tool_errors_total)")
    assert [(r["metric"]["gen_ai_tool_name"], r["metric"]["error_type"], r["value"][1]) for r in errors] == [
        ("fetch_page", "ConnectionError", "1")]
    # the cost panels' dollars: the demo's tokens at the override's price (0.5 in, 1.5 out per million)
    tokens = {r["metric"]["gen_ai_token_type"]: float(r["value"][1]) for r in _query(
        stack, "sum by (gen_ai_token_type) (gen_ai_client_token_usage_sum)")}
    (cost,) = _query(stack, "sum(agenttape_gen_ai_cost_usd_total)")
    assert float(cost["value"][1]) == pytest.approx((tokens["input"] * 0.5 + tokens["output"] * 1.5) / 1e6)


def test_promtool_accepts_the_shipped_prometheus_config(tmp_path):
    shipped = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    shutil.copy(shipped, tmp_path / "prometheus.yml")
    (tmp_path / "agenttape_token").write_text("a-token\n")  # the secret compose mounts beside it
    proc = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr
