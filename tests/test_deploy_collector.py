"""The collector configs of deploy/ name only components built into the pinned otelcol-contrib
distribution (deploy/collector/otelcol-contrib-components.yaml, from its builder manifest), wire every
pipeline to components they define, and the file-export path really loads into a store."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml
from google.protobuf.json_format import MessageToDict
from receiver_util import free_env, trace_request

ROOT = Path(__file__).resolve().parents[1]
COLLECTOR = ROOT / "deploy" / "collector"
KINDS = {"receivers": "receiver", "processors": "processor", "exporters": "exporter", "extensions": "extension",
         "connectors": "connector"}


def _components() -> dict:
    return yaml.safe_load((COLLECTOR / "otelcol-contrib-components.yaml").read_text())


def _configs() -> dict[str, dict]:
    out = {p.name: yaml.safe_load(p.read_text()) for p in sorted(COLLECTOR.glob("*.yaml"))
           if p.name != "otelcol-contrib-components.yaml"}
    cm = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "collector-configmap.yaml").read_text())
    out["k8s/collector-configmap.yaml"] = yaml.safe_load(cm["data"]["config.yaml"])
    return out


def _module_for(kind: str, type_: str, built: list[str]) -> str | None:
    """The manifest module that provides component ``type_`` (``health_check`` is healthcheckextension,
    ``file_storage`` is filestorage, ``otlphttp`` is otlphttpexporter, ...)."""
    bare = type_.replace("_", "")
    for candidate in (bare + KINDS[kind], bare):
        if candidate in built:
            return candidate
    return None


def test_component_list_names_its_source_and_version():
    text = (COLLECTOR / "otelcol-contrib-components.yaml").read_text()
    assert "distributions/otelcol-contrib/manifest.yaml" in text and "008cde8ca78cc0286ee3f0de92fa95e1641a445a" in text
    comp = _components()
    assert comp["version"] == "0.136.0"
    assert {"otlpreceiver", "loadbalancingexporter", "fileexporter", "batchprocessor"} <= {
        m for kind in KINDS for m in comp[kind]}


def test_images_pin_the_listed_collector_version():
    version = _components()["version"]
    images = [yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]["otel-collector"]["image"],
              yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "collector-deployment.yaml").read_text())
              ["spec"]["template"]["spec"]["containers"][0]["image"]]
    assert images == [f"otel/opentelemetry-collector-contrib:{version}"] * 2


@pytest.mark.parametrize("name", sorted(_configs()))
def test_config_names_only_components_of_the_distribution(name):
    cfg = _configs()[name]
    comp = _components()
    defined = set()
    for kind in KINDS:
        for cid in cfg.get(kind) or {}:
            type_ = cid.split("/", 1)[0]
            assert _module_for(kind, type_, comp[kind]), f"{name}: {kind[:-1]} {type_!r} is not in otelcol-contrib"
            defined.add((kind, cid))
    service = cfg["service"]
    used = {("extensions", e) for e in service.get("extensions", [])}
    for pname, pipe in service["pipelines"].items():
        assert pname.split("/")[0] in ("traces", "logs", "metrics")
        assert pipe["receivers"] and pipe["exporters"]
        for kind in ("receivers", "processors", "exporters"):
            for cid in pipe.get(kind, []):
                assert (kind, cid) in defined, f"{name}: pipeline {pname} uses undefined {kind[:-1]} {cid}"
                used.add((kind, cid))
    assert defined == used, f"{name}: defined but unused: {defined - used}"


def test_component_check_rejects_a_component_not_in_the_distribution():
    assert _module_for("exporters", "loadbalancing", _components()["exporters"]) == "loadbalancingexporter"
    assert _module_for("extensions", "file_storage", _components()["extensions"]) == "filestorage"
    assert _module_for("exporters", "agenttape", _components()["exporters"]) is None


def test_every_agenttape_bound_exporter_sends_the_token():
    for name, cfg in _configs().items():
        for cid, exp in cfg["exporters"].items():
            if cid.startswith("file"):
                continue
            headers = exp.get("headers") or exp.get("protocol", {}).get("otlp", {}).get("headers")
            assert headers == {"authorization": "Bearer ${env:AGENTTAPE_TOKEN}"}, (name, cid)


def _otlp_json_line(n: int) -> str:
    """One line as the collector's file exporter writes it: an ExportTraceServiceRequest in OTLP JSON."""
    doc = MessageToDict(trace_request(n))
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["traceId"] = base64.b64decode(span["traceId"]).hex()
        span["spanId"] = base64.b64decode(span["spanId"]).hex()
    return json.dumps(doc)


def test_file_export_is_loaded_by_the_ingest_loop(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "traces-2026-12-01T10-00-00.000.jsonl").write_text(_otlp_json_line(3) + "\n" + _otlp_json_line(2) + "\n")
    (export / "traces.jsonl").write_text(_otlp_json_line(4) + "\n")  # the file being written
    db = tmp_path / "t.duckdb"
    env = free_env() | {"OTEL_EXPORT_DIR": str(export), "AGENTTAPE_DB": str(db)}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]  # the venv's agenttape
    # the pass over closed (rotated) files that each tick makes, then the live file after the collector stopped
    subprocess.run(["sh", str(COLLECTOR / "ingest-loop.sh"), "--final"], env=env, check=True, timeout=120,
                   capture_output=True)
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM spans").fetchone()[0] == 9
    finally:
        con.close()
    assert list(export.iterdir()) == []
