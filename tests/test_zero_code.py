"""Zero code: an OpenAI app with no telemetry code, run under ``opentelemetry-instrument`` with
otel-agenttape installed, into a real `agenttape serve` on 127.0.0.1 (the OpenAI SDK against a fake
OpenAI-compatible server): its calls are listed as runs, replay their prompt and answer, verify as
sealed tapes, and a row altered in the store afterwards is caught."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
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


def _instrumented(db: str, app: str, *args: str, calls: list | None = None, instrument: bool = True,
                  **variables: str) -> subprocess.CompletedProcess[str]:
    """Run ``app`` (a test app with no telemetry code) under ``opentelemetry-instrument`` with our
    distro (``instrument=False``: plain python), against a fake OpenAI server, into a fresh `agenttape
    serve` on ``db`` (stopped after); the requests the fake server got go into ``calls``."""
    proc, info = serve(db)
    env = free_env()
    try:
        with FakeOpenAI() as fake:
            app_env = dict(env, OTEL_EXPORTER_OTLP_ENDPOINT=info["url"], OTEL_PYTHON_DISTRO="agenttape",
                           PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE), env.get("PYTHONPATH", "")]),
                           **variables)
            runner = [sys.executable, INSTRUMENT] if instrument else []
            done = subprocess.run([*runner, sys.executable, str(HERE / app), fake.base_url, *args],
                                  capture_output=True, text=True, env=app_env, timeout=180)
            if calls is not None:
                calls.extend(fake.requests)
            return done
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
    _assert_sealed_weather_runs(db, "weather")


def _assert_sealed_weather_runs(db: str, agent: str) -> None:
    """The OpenAI app's two chat calls are two runs of ``agent`` that replay their prompt and answer,
    verify, and fail verification once a row is altered."""
    env = free_env()
    runs = _cli("runs", "--db", db, "--json", env=env)
    assert runs.returncode == 0, runs.stderr
    listed = [json.loads(line) for line in runs.stdout.splitlines() if line.strip()]
    listed = listed[0] if len(listed) == 1 and isinstance(listed[0], list) else listed
    weather = [r for r in listed if r.get("agent") == agent]
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


def test_register_in_code_records_sealed_runs_like_the_zero_code_path(tmp_path):
    db = str(tmp_path / "inline.duckdb")
    app = _instrumented(db, "zero_code_register_app.py", instrument=False)
    assert app.returncode == 0, app.stderr
    assert "same tape" in app.stdout and "57" in app.stdout
    assert "agenttape: recording sealed tapes" in app.stderr and "opentelemetry-instrumentation-genai-openai" in app.stderr
    import otel_agenttape  # read in-process, through the read API the CLI calls

    with otel_agenttape.open(db) as tapes:
        runs = tapes.runs(agent="inline").runs
        assert len(runs) == 2 and all(r.model_calls == 1 for r in runs), runs
        texts = json.dumps([tapes.replay(r.ref) for r in runs])
        assert "Weather in Paris?" in texts and "It is 57F in Paris." in texts
        chains = tapes.verify()
        assert {c["chain_id"] for c in chains} == {r.tape_id for r in runs}, chains  # each run its sealed tape
        assert all(c["valid"] for c in chains), chains


@pytest.mark.skipif(INSTRUMENT is None, reason="opentelemetry-instrument is not installed")
def test_an_instrumented_langgraph_app_records_one_sealed_run_with_each_model_call_once(tmp_path):
    db = str(tmp_path / "graph.duckdb")
    calls: list = []
    # the default choice enables both OpenInference's LangChain and the OpenAI SDK instrumentation; the
    # app also asks one question through the SDK directly, outside LangChain
    app = _instrumented(db, "zero_code_langgraph_app.py", "Weather in Lyon?", "Weather in Oslo?", calls=calls,
                        OTEL_SERVICE_NAME="graph")
    assert app.returncode == 0, app.stderr
    assert "57F in Lyon" in app.stdout and "Oslo" in app.stdout
    assert "openinference-instrumentation-langchain" in app.stderr  # the startup line names it
    env = free_env()
    runs = _cli("runs", "--db", db, "--json", env=env)
    assert runs.returncode == 0, runs.stderr
    listed = json.loads(runs.stdout)
    # one model call recorded per request the model server got: three in the graph, one direct
    assert len(calls) == 4 and sum(r["model_calls"] for r in listed) == 4, listed
    assert "recorded once" in app.stderr  # and the startup line says so
    graphs = [r for r in listed if not r.get("parent_ref") and r["source"] == "langgraph"]
    assert len(graphs) == 1, listed  # the graph is one run, its nodes and agents below it
    roots = graphs
    direct = [r for r in listed if not r.get("parent_ref") and r is not graphs[0]]
    assert len(direct) == 1 and direct[0]["model_calls"] == 1, listed  # the SDK call outside LangChain
    oslo = _cli("replay", "--db", db, direct[0]["ref"], "--json", env=env)
    assert "Weather in Oslo?" in oslo.stdout, oslo.stdout + oslo.stderr
    replay = _cli("replay", "--db", db, roots[0]["ref"], "--tree", "--json", env=env)
    assert replay.returncode == 0, replay.stderr
    tree = json.loads(replay.stdout)
    assert "Weather in Lyon?" in json.dumps(tree["input"]) and "It is 57F in Lyon." in json.dumps(tree["output"])
    verified = _cli("verify", "--db", db, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.skipif(INSTRUMENT is None, reason="opentelemetry-instrument is not installed")
@pytest.mark.parametrize("ours", [True, False], ids=["our-processor", "agents-instrumentation"])
def test_an_instrumented_agents_sdk_app_records_each_model_call_once(tmp_path, ours):
    pytest.importorskip("agents")
    db = str(tmp_path / "agents.duckdb")
    calls: list = []
    # the OpenAI SDK instrumentation is on (zero code) beside the Agents SDK's own record of each model
    # call: our processor (added in the app's code) or the Agents SDK instrumentation the distro enabled
    extra = () if ours else ("--sdk-only",)
    app = _instrumented(db, "zero_code_agents_app.py", "Weather in Lyon?", "Weather in Oslo?", *extra, calls=calls,
                        OTEL_SERVICE_NAME="forecast", OPENAI_AGENTS_DISABLE_TRACING="false")  # (other tests set it)
    assert app.returncode == 0, app.stderr
    assert "It is 57F in Lyon." in app.stdout and "Oslo" in app.stdout
    assert "recorded once" in app.stderr and "openai_agents" in app.stderr  # the startup line says so
    env = free_env()
    listed = json.loads(_cli("runs", "--db", db, "--json", env=env).stdout)
    # one model call recorded per request the model server got: two in the agent's run, one direct
    assert len(calls) == 3 and sum(r["model_calls"] for r in listed) == 3, listed
    with duckdb.connect(db, read_only=True) as con:  # and one span each in the store, whatever its scope
        chats = con.execute("SELECT scope_name FROM spans WHERE name = 'chat gpt-test'").fetchall()
    assert len(chats) == 3, chats
    agent = [r for r in listed if r["agent"] == "forecaster"]  # (the instrumentation's under a workflow run)
    assert len(agent) == 1 and agent[0]["model_calls"] == 2 and agent[0]["tool_calls"] == 1, listed
    assert agent[0]["source"] == ("agenttape" if ours else "openai-agents"), agent
    assert "Weather in Lyon?" in _cli("replay", "--db", db, agent[0]["ref"], "--json", env=env).stdout
    direct = [r for r in listed if r["trace_id"] != agent[0]["trace_id"]]
    assert len(direct) == 1 and direct[0]["model_calls"] == 1, listed  # the SDK call outside the agent
    assert "Weather in Oslo?" in _cli("replay", "--db", db, direct[0]["ref"], "--json", env=env).stdout
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


@pytest.mark.skipif(INSTRUMENT is None, reason="opentelemetry-instrument is not installed")
def test_an_instrumented_app_killed_with_the_receiver_down_loses_nothing_it_sealed_or_logged(tmp_path):
    from capture_servers import free_ports, serve_process
    from test_faults_capture import outbox_keys

    from otel_agenttape import outboxfile

    box, db = tmp_path / "outbox", str(tmp_path / "crash.duckdb")
    http_port, grpc_port = free_ports(2)
    with FakeOpenAI() as fake:
        env = dict(free_env(), OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{http_port}", OTEL_PYTHON_DISTRO="agenttape",
                   OTEL_SERVICE_NAME="crash", AGENTTAPE_OUTBOX=str(box), AGENTTAPE_TIMEOUT="1",
                   PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))

        def app(*args: str, **more: str) -> subprocess.Popen:
            return subprocess.Popen([sys.executable, INSTRUMENT, sys.executable, str(HERE / "zero_code_openai_app.py"),
                                     fake.base_url, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=dict(env, **more))

        def signed_traces() -> set[str]:
            """The traces whose checkpoint span the outbox holds."""
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

            out = set()
            for rec in outboxfile.read_outbox(box) if box.exists() else ():
                req = ExportTraceServiceRequest.FromString(rec.payload)
                out |= {s.trace_id.hex() for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans
                        if s.name == "agenttape.checkpoint"}
            return out

        def logs_kept() -> int:
            return sum(r.items for r in outboxfile.read_outbox(box / outboxfile.LOGS_FOLDER))

        # no receiver on the port yet; the app's Python logging bridged into log records
        first = app("--hold", "--warnings", OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED="true")
        try:
            for line in first.stdout:
                if line.startswith("held"):
                    break
            else:
                raise AssertionError(first.stderr.read())
            # both traces sealed and signed (the checkpoint thread signs within its short delay) and both
            # log records written to the outbox
            deadline = time.monotonic() + 60
            while len(signed_traces()) < 2 or logs_kept() < 2:
                assert time.monotonic() < deadline and first.poll() is None, first.stderr.read()
                time.sleep(0.1)
            os.kill(first.pid, signal.SIGKILL)  # mid-run: the app holds, nothing flushed at exit
            first.wait(10)
        finally:
            if first.poll() is None:
                first.kill()
        kept = set(outbox_keys(box))
        assert len(kept) >= 2 and logs_kept() == 2
        server, info = serve_process(db, http_port, grpc_port)
        try:
            second = app("--city", "Lyon")  # the next process with this outbox re-sends what the first kept
            out, err = second.communicate(timeout=120)
            assert second.returncode == 0, err
            deadline = time.monotonic() + 60
            while not kept <= set(_stored(info["url"])) or len(_logged(info["url"])) < 2:
                assert time.monotonic() < deadline, (kept, _stored(info["url"]), _logged(info["url"]))
                time.sleep(0.2)
            logged = _logged(info["url"])
            assert sorted(logged) == ["answered: It is 57F in Paris.", "the model asked for a tool in Paris"], logged
        finally:
            code, err = stop(server)
        assert code == 0, err
    env = free_env()
    listed = json.loads(_cli("runs", "--db", db, "--json", env=env).stdout)
    paris = [r for r in listed if r["trace_id"] in {t for t, _ in kept}]
    assert len(paris) == 2 and all(r["agent"] == "crash" for r in paris), listed
    texts = "".join(_cli("replay", "--db", db, r["ref"], "--json", env=env).stdout for r in paris)
    assert "Weather in Paris?" in texts and "It is 57F in Paris." in texts
    verified = _cli("verify", "--db", db, "--json", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    chains = json.loads(verified.stdout)["chains"]
    assert {r["tape_id"] for r in paris} <= {c["chain_id"] for c in chains if c["valid"]}, chains


def _stored(url: str) -> list[tuple[str, str]]:
    from test_faults_capture import stored

    return stored(url)


def _logged(url: str) -> list[str]:
    """The bodies of the log records of the app's own logger the receiver stored."""
    import httpx
    import pyarrow as pa

    r = httpx.post(f"{url}/api/query", json={"sql": "SELECT body FROM log_records WHERE scope_name = 'weather'"},
                   timeout=60)
    assert r.status_code == 200, r.text
    bodies = [json.loads(b) if isinstance(b, str) else b for b in pa.ipc.open_stream(r.content).read_all().column(0).to_pylist()]
    return [b.get("s") for b in bodies]  # typed JSON: a string body is {"s": text}


def test_log_records_the_receiver_does_not_take_are_kept_counted_and_ingested(tmp_path, monkeypatch):
    from capture_servers import free_port
    from opentelemetry._logs import LogRecord
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

    from otel_agenttape.capture.log_export import TapeLogExporter
    from otel_agenttape.receiver.files import ingest_files

    box, db = tmp_path / "outbox", str(tmp_path / "logs.duckdb")
    exporter = TapeLogExporter(OTLPLogExporter(endpoint=f"http://127.0.0.1:{free_port()}/v1/logs", timeout=0.5),
                               outbox=box)
    provider = LoggerProvider(shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger("weather")
    for text in ("first", "second"):
        logger.emit(LogRecord(body=text, event_name="weather.said"))
    provider.shutdown()
    stats = exporter.stats()
    assert stats["logs_to_outbox"] == 2 and stats["logs_outbox_pending"] == 2 and stats["logs_exported"] == 0, stats
    from otel_agenttape.doctor import diagnose

    monkeypatch.setenv("AGENTTAPE_OUTBOX", str(box))
    check = next(c for c in diagnose(str(tmp_path / "none.duckdb")) if c.name == "outbox")
    assert check.ok and check.data["log_records"] == 2 and "2 log records waiting" in check.detail, check
    summary = ingest_files([str(box)], db)  # `agenttape ingest OUTBOX` reads the log lanes too
    assert summary["logs"] == 2 and summary["spans"] == 0, summary
    with duckdb.connect(db, read_only=True) as con:
        bodies = sorted(json.loads(b)["s"] for (b,) in con.execute("SELECT body FROM log_records").fetchall())
    assert bodies == ["first", "second"]


@pytest.mark.skipif(INSTRUMENT is None, reason="opentelemetry-instrument is not installed")
def test_content_sent_as_log_events_is_sealed_into_its_model_call(tmp_path):
    """With the GenAI instrumentation writing content as log events (``event_only``), the records are
    sealed into their model call's span: verify passes, and an altered, removed or added log row is
    caught at that span's seq."""
    db = str(tmp_path / "events.duckdb")
    app = _instrumented(db, "zero_code_openai_app.py", OTEL_SERVICE_NAME="weather",
                        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="event_only",
                        OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental")
    assert app.returncode == 0, app.stderr
    assert "sealed logs to" in app.stderr
    with duckdb.connect(db) as con:
        logs = con.execute("SELECT span_id, attributes FROM log_records WHERE attributes LIKE '%57F%'").fetchall()
        spans = con.execute("SELECT count(*) FROM spans WHERE attributes LIKE '%57F%'").fetchone()[0]
    assert logs and spans == 0, (logs, spans)  # the answer's content is only in the log records
    assert all(span_id for span_id, _ in logs)
    env = free_env()
    replays = [_cli("replay", "--db", db, r["ref"], "--json", env=env).stdout
               for r in json.loads(_cli("runs", "--db", db, "--json", env=env).stdout)]
    assert "It is 57F in Paris." in "".join(replays)
    verified = _cli("verify", "--db", db, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    def verdict() -> str:
        out = _cli("verify", "--db", db, "--json", env=env)
        assert out.returncode == 1, out.stdout + out.stderr
        return " ".join(c["reason"] or "" for c in json.loads(out.stdout)["chains"] if not c["valid"])

    copy = str(tmp_path / "events-copy.duckdb")
    shutil.copy(db, copy)
    with duckdb.connect(db) as con:  # an answer altered in its log row
        con.execute("UPDATE log_records SET attributes = replace(attributes, '57F', '75F') WHERE attributes LIKE '%57F%'")
    assert "edited or added" in verdict()
    shutil.copy(copy, db)
    with duckdb.connect(db) as con:  # a log row deleted
        con.execute("DELETE FROM log_records WHERE attributes LIKE '%57F%'")
    assert "missing" in verdict()
    shutil.copy(copy, db)
    with duckdb.connect(db) as con:  # a forged log row added under a sealed model call
        con.execute("INSERT INTO log_records SELECT * REPLACE (log_id || 'x' AS log_id, "
                    "replace(attributes, '57F', '99F') AS attributes) FROM log_records WHERE attributes LIKE '%57F%'")
    assert "edited or added" in verdict()
