"""Zero code: an OpenAI app with no telemetry code, run under ``opentelemetry-instrument`` with
otel-agenttape installed, into a real `agenttape serve` on 127.0.0.1 (the OpenAI SDK against a fake
OpenAI-compatible server): its calls are listed as runs, replay their prompt and answer, verify as
sealed tapes, and a row altered in the store afterwards is caught."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from faults_util import serve, stop
from receiver_util import free_env
from tape_fakeopenai import FakeOpenAI

HERE = Path(__file__).parent
INSTRUMENT = shutil.which("opentelemetry-instrument", path=os.path.dirname(sys.executable)) or shutil.which(
    "opentelemetry-instrument")


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_agenttape.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _instrumented(db: str, app: str, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run ``app`` (a test app with no telemetry code) under ``opentelemetry-instrument`` with our
    distro, against a fake OpenAI server, into a fresh `agenttape serve` on ``db`` (stopped after)."""
    proc, info = serve(db)
    env = free_env()
    try:
        with FakeOpenAI() as fake:
            app_env = dict(env, OTEL_EXPORTER_OTLP_ENDPOINT=info["url"], OTEL_PYTHON_DISTRO="agenttape",
                           PYTHONPATH=os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")]), **variables)
            return subprocess.run([sys.executable, INSTRUMENT, sys.executable, str(HERE / app), fake.base_url, *args],
                                  capture_output=True, text=True, env=app_env, timeout=180)
    finally:
        code, err = stop(proc)
        assert code == 0, err


@pytest.mark.skipif(INSTRUMENT is None, reason="opentelemetry-instrument is not installed")
def test_an_instrumented_openai_app_records_sealed_runs(tmp_path):
    db = str(tmp_path / "tape.duckdb")
    app = _instrumented(db, "zero_code_openai_app.py", OTEL_SERVICE_NAME="weather")
    assert app.returncode == 0, app.stderr
    assert "57" in app.stdout  # the app itself ran as without instrumentation
    assert "agenttape" in app.stderr and "seal" in app.stderr.lower()  # the one startup line
    env = free_env()
    runs = _cli("runs", "--db", db, "--json", env=env)
    assert runs.returncode == 0, runs.stderr
    listed = [json.loads(line) for line in runs.stdout.splitlines() if line.strip()]
    listed = listed[0] if len(listed) == 1 and isinstance(listed[0], list) else listed
    weather = [r for r in listed if r.get("agent") == "weather"]
    assert len(weather) == 2, listed  # two chat calls with no span around them: two runs
    replays = [_cli("replay", "--db", db, r["ref"], "--json", env=env) for r in weather]
    texts = "\n".join(r.stdout for r in replays)
    assert "Weather in Paris?" in texts and "It is 57F in Paris." in texts
    verified = _cli("verify", "--db", db, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    with duckdb.connect(db) as con:
        con.execute("UPDATE spans SET attributes = replace(attributes, '57F', '75F') "
                    "WHERE attributes LIKE '%57F%'")
    tampered = _cli("verify", "--db", db, env=env)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr


@pytest.mark.skipif(INSTRUMENT is None, reason="opentelemetry-instrument is not installed")
def test_an_instrumented_langgraph_app_records_one_sealed_run_with_its_question_and_answer(tmp_path):
    db = str(tmp_path / "graph.duckdb")
    # the OpenAI SDK's own instrumentation would record each ChatOpenAI call again, as a trace of its
    # own (OpenInference's LangChain spans are not made current for the SDK call)
    app = _instrumented(db, "zero_code_langgraph_app.py", "Weather in Lyon?", OTEL_SERVICE_NAME="graph",
                        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="openai")
    assert app.returncode == 0, app.stderr
    assert "57F in Lyon" in app.stdout
    assert "openinference-instrumentation-langchain" in app.stderr  # the startup line names it
    env = free_env()
    runs = _cli("runs", "--db", db, "--json", env=env)
    assert runs.returncode == 0, runs.stderr
    listed = json.loads(runs.stdout)
    roots = [r for r in listed if not r.get("parent_ref")]
    assert len(roots) == 1, listed  # the graph is one run, its nodes and agents below it
    replay = _cli("replay", "--db", db, roots[0]["ref"], "--tree", "--json", env=env)
    assert replay.returncode == 0, replay.stderr
    tree = json.loads(replay.stdout)
    assert "Weather in Lyon?" in json.dumps(tree["input"]) and "It is 57F in Lyon." in json.dumps(tree["output"])
    verified = _cli("verify", "--db", db, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_every_setting_is_documented_with_its_variables():
    from otel_agenttape.capture.settings import OPTIONS

    api = (HERE.parent / "docs" / "api.md").read_text()
    for option in OPTIONS:
        row = next((line for line in api.splitlines() if line.startswith(f"| `{option.env}` |")), None)
        assert row is not None, f"{option.env} is not in docs/api.md"
        for standard in option.standard:
            assert f"`{standard}`" in row, (option.env, standard)


def test_doctor_shows_what_an_instrumented_process_would_record(tmp_path):
    env = dict(free_env(), OTEL_SERVICE_NAME="billing", AGENTTAPE_OUTBOX=str(tmp_path / "outbox"),
               OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    out = _cli("doctor", "--db", str(tmp_path / "none.duckdb"), "--json", env=env)
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    zero = checks["zero-code configuration"]
    assert zero["status"] == "ok"
    assert "as service 'billing'" in zero["detail"] and f"outbox {tmp_path / 'outbox'}" in zero["detail"]
    assert zero["data"]["sources"]["service_name"] == "OTEL_SERVICE_NAME"
    assert zero["data"]["sources"]["outbox"] == "AGENTTAPE_OUTBOX"
    bad = _cli("doctor", "--db", str(tmp_path / "none.duckdb"), "--json",
               env=dict(env, AGENTTAPE_MAX_REQUEST_BYTES="lots"))
    zero = {c["name"]: c for c in json.loads(bad.stdout)}["zero-code configuration"]
    assert zero["status"] == "FAIL" and "AGENTTAPE_MAX_REQUEST_BYTES" in zero["detail"]
