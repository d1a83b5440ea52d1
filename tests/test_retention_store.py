"""Retention on a DuckDB store (``agenttape retain``, docs/integrity.md "Retention"): the lake's rule
(UTC dates before today minus N days), spans dropped and recorded so verify tells retention from
tampering, or with --content-only only their content erased; the lake publisher's cursor follows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import duckdb
import pytest
from integrity_support import encode, sealed_provider
from opentelemetry import trace

import otel_agenttape
from otel_agenttape import semconv
from otel_agenttape.integrity import Signer
from otel_agenttape.store.writer import Store
from otel_agenttape.tape.verification import verify_store

KEY = Signer.generate("retention-test.agenttape/key")
DAY = 86_400 * 1_000_000_000
OLD_TEXT = "Vintage-question-5150"
NEW_TEXT = "Recent-question-2718"


def _node(tracer, parent, run_id: str, i: int, text: str, at: int) -> None:
    sp = tracer.start_span(f"chat {i}", context=trace.set_span_in_context(parent), start_time=at, attributes={
        semconv.RUN_ID: run_id, semconv.NODE_TYPE: "model", semconv.STEP: i, semconv.GEN_AI_OPERATION_NAME: "chat",
        semconv.GEN_AI_REQUEST_MODEL: "m",
        semconv.GEN_AI_INPUT_MESSAGES: json.dumps([{"role": "user", "parts": [{"type": "text", "content": text}]}])})
    sp.end(end_time=at + 1_000_000)


def _spans():
    """Run ``old`` wholly 40 days ago; run ``mixed``: two nodes 40 days ago (seq 0, 1), one and its run now."""
    provider, sealer, exporter = sealed_provider(checkpoint_every=2, signing_key=KEY)
    tracer = provider.get_tracer("otel_agenttape")
    now = time.time_ns()
    then = now - 40 * DAY
    for run_id, starts in (("old", [then, then, then]), ("mixed", [then, then, now])):
        run = tracer.start_span("run", start_time=starts[-1] if run_id == "mixed" else then, attributes={
            semconv.RUN_ID: run_id, semconv.RUN_STATUS: semconv.STATUS_COMPLETED})
        for i, at in enumerate(starts):
            _node(tracer, run, run_id, i, OLD_TEXT if at == then else NEW_TEXT, at)
        run.end(end_time=now + 2_000_000)
    provider.shutdown()
    assert sealer.errors == 0
    return list(exporter.get_finished_spans())


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("retain") / "base.duckdb")
    store = Store(path)
    store.write_traces([encode(_spans())])
    store.close()
    return path


def _copy(src: str, tmp_path, name: str) -> str:
    path = str(tmp_path / name)
    shutil.copy(src, path)
    return path


def _reports(path: str) -> dict:
    with otel_agenttape.open(path) as tapes:
        return {r.chain_id: r for r in verify_store(tapes.reader, verifiers=[KEY.verifier()])}


def _texts(path: str) -> str:
    con = duckdb.connect(path, read_only=True)
    try:
        return con.execute("SELECT coalesce(string_agg(attributes, ''), '') FROM spans").fetchone()[0]
    finally:
        con.close()


def test_retain_drops_old_spans_and_verify_counts_them_as_retention(store_path, tmp_path) -> None:
    path = _copy(store_path, tmp_path, "drop.duckdb")
    with otel_agenttape.open(path) as tapes:
        dry = tapes.retain(older_than_days=30, reason="keep 30 days", dry_run=True)
        done = tapes.retain(older_than_days=30, reason="keep 30 days")
    assert dry["dry_run"] and (dry["spans"], dry["chains"]) == (done["spans"], done["chains"]) == (6, 2)
    assert OLD_TEXT not in _texts(path) and NEW_TEXT in _texts(path)
    reports = _reports(path)
    mixed = reports["mixed"]
    assert mixed.valid, mixed.reason  # seq 0 and 1 are gone, recorded: entry 2 links to their recorded head
    assert "old" not in reports or reports["old"].valid
    # the same two entries deleted by hand, with no record: a gap, caught at the first missing seq
    forged = _copy(store_path, tmp_path, "forged.duckdb")
    con = duckdb.connect(forged)
    try:
        con.execute("DELETE FROM spans WHERE run_id = 'mixed' AND chain_seq < 2")
    finally:
        con.close()
    r = _reports(forged)["mixed"]
    assert not r.valid and r.first_broken_index == 0, r.reason


def test_retain_content_only_erases_and_keeps_the_spans(store_path, tmp_path) -> None:
    path = _copy(store_path, tmp_path, "content.duckdb")
    with otel_agenttape.open(path) as tapes:
        done = tapes.retain(older_than_days=30, reason="keep content 30 days", content_only=True, signing_key=KEY)
    assert done["erasure_id"] and (done["spans"], done["values"]) == (5, 5)
    con = duckdb.connect(path, read_only=True)
    try:
        (n,) = con.execute("SELECT count(*) FROM spans WHERE run_id IN ('old', 'mixed')").fetchone()
    finally:
        con.close()
    assert n == 8 and OLD_TEXT not in _texts(path) and NEW_TEXT in _texts(path)
    reports = _reports(path)
    assert all(r.valid for r in reports.values()) and reports["old"].erased_values == 3


def test_the_lake_publisher_cursor_moves_with_the_dropped_rows(store_path, tmp_path) -> None:
    from otel_agenttape.store.lake.publish import LakePublisher

    path = _copy(store_path, tmp_path, "published.duckdb")
    lake = str(tmp_path / "lake")
    store = Store(path)
    LakePublisher(store, lake, "r0").publish_all()
    store.close()
    with otel_agenttape.open(path) as tapes:
        tapes.retain(older_than_days=30, reason="keep 30 days")
    store = Store(path)
    pub = LakePublisher(store, lake, "r0")
    assert pub.unpublished()["spans"] == 0  # nothing left over, nothing skipped
    store.write_traces([encode(_spans())])  # new rows after the retention are published, all of them
    assert pub.unpublished()["spans"] == 12  # 8 spans and 4 checkpoints
    store.close()


def test_cli_retain_matches_lake_retain(store_path, tmp_path) -> None:
    path = _copy(store_path, tmp_path, "cli.duckdb")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "otel_agenttape", "retain", "--db", path, "--older-than", "30d",
                          "--reason", "policy"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "removed 6 spans and 0 log records dated before" in out.stdout
    assert "recorded 2 tape ranges as removed by retention" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "otel_agenttape", "retain", "--db", path, "--older-than", "a month",
                          "--reason", "policy"], capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "give whole days, like 30d" in bad.stderr
