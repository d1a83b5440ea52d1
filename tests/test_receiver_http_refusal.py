"""A body over the limit gets its 413 with every stock HTTP client, whatever its size, and refusing it
costs the receiver no memory: a real `agenttape serve` process on 127.0.0.1, its peak RSS read from
/proc while it refuses.

The clients differ where it matters: urllib sends ``Connection: close`` (the server closes after
the answer while the body is still arriving), requests and httpx keep the connection alive (the
refused body is read and dropped, then the connection serves the next request), and the official
OTLP exporter must see one 413 and not retry it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import httpx
import pytest
import requests
from faults_util import serve, stop
from receiver_util import PB, trace_request

MAX_BODY = 4 * 1024 * 1024  # 10 and 40 MB are dropped on a kept-alive connection, 200 MB lingers
SIZES_MB = (10, 40, 200)


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    db = tmp_path_factory.mktemp("refusal") / "tape.duckdb"
    proc, info = serve(str(db), "--max-body", str(MAX_BODY))
    url = info["url"]
    assert httpx.post(f"{url}/v1/traces", content=trace_request(3).SerializeToString(), headers=PB).status_code == 200
    yield proc, url, _peak_rss_mb(proc.pid)
    code, err = stop(proc)
    assert code == 0, err


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _refused(url: str) -> float:
    """Requests answered 413 so far, over every transport and signal."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("agenttape_requests_total{") and 'code="413"' in line)


def _json_body(mb: int) -> bytes:
    return b"{" + b" " * (mb * 1024 * 1024) + b"}"


def _check_413(status: int, body: bytes, mb: int) -> None:
    assert status == 413, (status, body[:200])
    message = json.loads(body)["message"]
    assert f"request body of {mb * 1024 * 1024 + 2} bytes exceeds the limit of {MAX_BODY} bytes" == message


def _still_serves(url: str) -> None:
    r = httpx.post(f"{url}/v1/traces", content=trace_request(1).SerializeToString(), headers=PB, timeout=30)
    assert r.status_code == 200


@pytest.mark.parametrize("mb", SIZES_MB)
def test_urllib_with_connection_close_reads_the_413(receiver, mb):
    _, url, _ = receiver
    req = urllib.request.Request(f"{url}/v1/traces", data=_json_body(mb),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:  # not URLError(ConnectionResetError)
        urllib.request.urlopen(req, timeout=60)
    _check_413(err.value.code, err.value.read(), mb)
    _still_serves(url)


@pytest.mark.parametrize("mb", SIZES_MB)
def test_requests_on_a_kept_alive_session_reads_the_413_and_goes_on(receiver, mb):
    _, url, _ = receiver
    with requests.Session() as session:
        r = session.post(f"{url}/v1/traces", data=_json_body(mb), headers={"Content-Type": "application/json"},
                         timeout=60)
        _check_413(r.status_code, r.content, mb)
        ok = session.post(f"{url}/v1/traces", data=trace_request(1).SerializeToString(), headers=PB, timeout=30)
        assert ok.status_code == 200


@pytest.mark.parametrize("mb", SIZES_MB)
def test_httpx_reads_the_413_and_its_connection_goes_on(receiver, mb):
    _, url, _ = receiver
    with httpx.Client(timeout=60) as client:
        r = client.post(f"{url}/v1/traces", content=_json_body(mb), headers={"Content-Type": "application/json"})
        _check_413(r.status_code, r.content, mb)
        assert client.post(f"{url}/v1/traces", content=trace_request(1).SerializeToString(),
                           headers=PB).status_code == 200


@pytest.mark.parametrize("mb", SIZES_MB)
def test_the_official_exporter_gets_one_413_and_does_not_retry(receiver, mb):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    _, url, _ = receiver
    before = _refused(url)
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", max_request_size=512 * 1024 * 1024, timeout=60)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    t0 = time.monotonic()
    with provider.get_tracer("t").start_as_current_span("huge") as span:
        span.set_attribute("blob", "x" * (mb * 1024 * 1024))
    provider.shutdown()
    elapsed = time.monotonic() - t0
    after = _refused(url)
    assert after - before == 1  # one attempt, answered: a reset would have made the exporter retry
    assert elapsed < 30


def test_refusing_holds_no_body_in_memory(receiver):
    """Runs after the others in this module: 4 clients x (10 + 40 + 200 MB) refused, and the
    receiver's peak RSS stays within a few MB of what it was before the first refusal."""
    proc, url, peak = receiver
    for mb in SIZES_MB:
        r = httpx.post(f"{url}/v1/traces", content=_json_body(mb), headers={"Content-Type": "application/json",
                                                                            "Connection": "close"}, timeout=60)
        assert r.status_code == 413
    grown = _peak_rss_mb(proc.pid) - peak
    print(f"peak RSS before refusing {peak:.1f} MB, grown by {grown:.1f} MB over 13 refused bodies")
    assert grown < 24, f"the peak RSS grew by {grown:.1f} MB while refusing"
    assert _refused(url) == 5 * len(SIZES_MB)  # 4 clients and this test, each size once
    _still_serves(url)
