"""Erasing a store while its receiver ingests (docs/integrity.md, "Erasure"): the receiver erases
(``POST /api/erase``, token-gated), its writes wait only while the file is rewritten, and every span it
acknowledged before or during the erasure is in the store afterwards; the tapes still verify."""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
import urllib.error
import urllib.request

import pytest
from integrity_support import encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_erasure import KEY, SECRET, _spans

import otel_agenttape
from otel_agenttape.receiver.server import TapeServer
from otel_agenttape.tape.verification import verify_store

TOKEN = "erase-live-token"


def _post(url: str, body: bytes, path: str = "/v1/traces", token: str | None = TOKEN,
          ctype: str = "application/x-protobuf") -> int:
    headers = {"Content-Type": ctype}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _request(n: int, trace_id: bytes | None = None, name: str = "load", start: int = 0,
             filler_bytes: int = 0) -> tuple[bytes, list[str]]:
    """A request of ``n`` plain spans with fresh ids (their span ids, hex), in a fresh trace or
    ``trace_id``, each with ``filler_bytes`` random bytes (as hex) in ``filler.text`` when asked."""
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    trace_id = trace_id or os.urandom(16)
    ids = []
    now = time.time_ns()
    for i in range(n):
        sp = ss.spans.add()
        sp.trace_id, sp.span_id = trace_id, os.urandom(8)
        sp.name, sp.kind = f"{name} {start + i}", 1
        sp.start_time_unix_nano, sp.end_time_unix_nano = now, now + 1000
        if filler_bytes:
            kv = sp.attributes.add()
            kv.key, kv.value.string_value = "filler.text", os.urandom(filler_bytes).hex()
        ids.append(sp.span_id.hex())
    return req.SerializeToString(), ids


class Ingest:
    """Requests of 50 fresh spans posted on a thread until ``stop()``: the span ids acknowledged (200)
    and the statuses refused (an exporter retries those; they were not acknowledged)."""

    def __init__(self, url: str, token: str | None = TOKEN) -> None:
        self.url, self.token = url, token
        self.acked: list[str] = []
        self.refused: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def start(self) -> Ingest:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            body, ids = _request(50)
            status = _post(self.url, body, token=self.token)
            if status == 200:
                self.acked.extend(ids)
            else:
                self.refused.append(status)

    def stop(self, timeout: float = 60) -> None:
        self._stop.set()
        self._thread.join(timeout)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("live") / "live.duckdb")
    server = TapeServer(db, http_port=0, grpc_enabled=False, ingest_workers=0, token=TOKEN).start()
    try:
        assert _post(server.url, encode(_spans()).SerializeToString()) == 200
        assert server.pipeline.wait_idle(30)
        ingest = Ingest(server.url).start()
        acked, refused = ingest.acked, ingest.refused
        time.sleep(0.3)
        before = len(acked)
        with otel_agenttape.open(db) as tapes:
            assert tapes.reader.kind == "server"
            result = tapes.erase(session="s1", reason="GDPR art. 17 request #9", signing_key=KEY)
        during = len(acked) - before
        time.sleep(0.3)
        ingest.stop()
        assert server.pipeline.wait_idle(60)
        reader = server.store.reader()
        try:
            stored = set(reader.query("SELECT span_id FROM spans WHERE name LIKE 'load %'").column(0).to_pylist())
            reports = {r.chain_id: r for r in verify_store(reader, verifiers=[KEY.verifier()])}
        finally:
            reader.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(SECRET.encode() in p.read_bytes() for p in server.wal_dir.glob("*")):
            time.sleep(0.1)  # the rotated segment goes once the records after it are stored
        wal_bytes = b"".join(p.read_bytes() for p in server.wal_dir.glob("*") if p.is_file())
        bad_token = _post(server.url, b"{}", "/api/erase", token="wrong", ctype="application/json")
        with otel_agenttape.open(db) as tapes:  # retention of content is an erasure: through the server too
            kept = tapes.retain(older_than_days=1, reason="no content kept", content_only=True, signing_key=KEY,
                                dry_run=True, today=dt.date.today() + dt.timedelta(days=2))
        yield {"result": result, "acked": acked, "stored": stored, "reports": reports, "during": during,
               "wal_bytes": wal_bytes, "refused": refused, "bad_token": bad_token, "db": db, "kept": kept}
    finally:
        server.stop()


def test_every_acknowledged_span_is_stored_after_the_erasure(live) -> None:
    assert live["result"]["erasure_id"] and (live["result"]["spans"], live["result"]["values"]) == (6, 18)
    assert len(live["acked"]) > 100 and live["during"] > 0, (len(live["acked"]), live["during"])
    missing = set(live["acked"]) - live["stored"]
    assert not missing, f"{len(missing)} acknowledged spans lost"
    assert live["result"]["writes_paused_seconds"] < 30


def test_the_tapes_verify_and_no_copy_is_left_in_the_receiver_wal(live) -> None:
    reports = live["reports"]
    assert all(r.valid for r in reports.values()), {k: r.reason for k, r in reports.items()}
    assert reports["a1"].erased_values == 9 and reports["b1"].erased_values == 0
    assert SECRET.encode() not in live["wal_bytes"]
    with open(live["db"], "rb") as fh:
        assert SECRET.encode() not in fh.read()
    assert reports["b1"].valid and reports["b1"].length == 4  # the other session's tape is whole


def test_the_erase_endpoint_needs_the_token(live) -> None:
    assert live["bad_token"] == 401


def test_retain_content_only_goes_through_the_running_receiver(live) -> None:
    kept = live["kept"]
    # everything is dated today, before the cutoff: what is left to erase is b1's (s1's went before)
    assert kept["dry_run"] and kept["content_only"] and (kept["spans"], kept["values"]) == (3, 9)
