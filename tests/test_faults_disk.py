"""A full disk: exports answer 503 and /healthz says why while nothing can be written, and everything
works again once space is back, without a restart. Every acknowledged span is stored exactly once.

Twice: with an injected ENOSPC on the write-ahead log (always runs), and with a real 8 MiB tmpfs that
the test fills (needs the right to mount; skipped otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from faults_util import metric, serve, stop, stored_keys, wait_for
from receiver_util import PB, free_env, span_keys, trace_request

HERE = Path(__file__).parent


def _post(c: httpx.Client, url: str, req) -> int:
    return c.post(f"{url}/v1/traces", content=req.SerializeToString(), headers=PB).status_code


def _doctor(db: str) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "otel_agenttape.cli", "doctor", "--db", db, "--json"],
                         capture_output=True, text=True, env=free_env(), timeout=120)
    return out.returncode, {c["name"]: c for c in json.loads(out.stdout)}


def _all_stored(url: str, acked: set, timeout: float = 30) -> list:
    assert wait_for(lambda: len(stored_keys(url)) >= len(acked), timeout, 0.3)
    return stored_keys(url)


def test_injected_enospc_fails_only_while_full_and_recovers_without_restart(tmp_path):
    db = str(tmp_path / "full.duckdb")
    flag = tmp_path / "disk-is-full"
    proc, info = serve(db, "--ingest-workers", "0", env={**free_env(), "ENOSPC_FLAG": str(flag)},
                       entry=[str(HERE / "enospc_serve.py")])
    url = info["url"]
    acked: set = set()
    try:
        with httpx.Client(timeout=30) as c:
            for _ in range(5):
                req = trace_request(20)
                assert _post(c, url, req) == 200
                acked |= span_keys(req)
            flag.touch()  # the disk is full from now on
            refused = [trace_request(20) for _ in range(4)]
            for req in refused:
                assert _post(c, url, req) == 503
            health = c.get(f"{url}/healthz")
            assert health.status_code == 503
            assert "write-ahead log cannot write" in health.text and "No space left on device" in health.text
            metrics = c.get(f"{url}/metrics").text
            assert metric(metrics, "agenttape_writable") == 0 and metric(metrics, "agenttape_wal_write_errors") >= 4
            time.sleep(1.5)  # the disk probe keeps failing while full
            assert c.get(f"{url}/healthz").status_code == 503
            code, checks = _doctor(db)
            assert code == 1 and checks["receiver"]["status"] == "FAIL"
            assert "No space left on device" in checks["receiver"]["detail"]
            flag.unlink()  # space is back
            assert wait_for(lambda: c.get(f"{url}/healthz").status_code == 200, 10)
            for req in refused:  # what a client retries after its 503
                assert _post(c, url, req) == 200
                acked |= span_keys(req)
            assert metric(c.get(f"{url}/metrics").text, "agenttape_writable") == 1
            code, checks = _doctor(db)  # what failed before is information now
            assert code == 0, checks
            assert checks["past losses"]["status"] == "info"
            assert "4 write-ahead log writes failed" in checks["past losses"]["detail"]
        stored = _all_stored(url, acked)
        assert sorted(stored) == sorted(acked)  # every acknowledged span, once
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert "no transaction is active" not in err
    assert "No space left on device" in err  # the real cause is logged, not a rollback error


def _mount_tmpfs(where: Path, size: str = "8m") -> bool:
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.parametrize("wal_elsewhere", [False, True], ids=["all-on-the-full-disk", "store-on-the-full-disk"])
def test_a_full_tmpfs_then_space_back(tmp_path, wal_elsewhere):
    """All on the full disk, the write-ahead log fails first (it is written before the store); with the
    log on another disk (its folder a link there), the store's own writes fail and are retried."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt):
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)")
    proc = None
    try:
        db = str(mnt / "tape.duckdb")
        if wal_elsewhere:
            (tmp_path / "wal").mkdir()
            os.symlink(tmp_path / "wal", db + ".otlpwal")
        proc, info = serve(db, "--ingest-workers", "0")
        url = info["url"]
        st = os.statvfs(mnt)
        filler = mnt / "filler"
        filler.write_bytes(bytes(max(0, st.f_bavail * st.f_frsize - 1_500_000)))
        acked: set = set()
        refused = []
        with httpx.Client(timeout=30) as c:
            # the store's writes fail a moment after the data reaches it (its writer batches), so keep
            # sending for a bounded time rather than a fixed number of requests
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                req = trace_request(40, attrs={"gen_ai.input.messages": "m" * 2000})
                code = _post(c, url, req)
                if code == 200:
                    acked |= span_keys(req)
                else:
                    assert code == 503
                    refused.append(req)
                    if len(refused) >= 3:
                        break
                if len(acked) > 2400:
                    time.sleep(0.2)
            assert refused, "the disk never filled"
            assert wait_for(lambda: c.get(f"{url}/healthz").status_code == 503, 15)
            reason = c.get(f"{url}/healthz").text
            # with both on the full disk either may meet it first (the store's writer and the log race
            # for the last blocks); with the log elsewhere only the store can
            causes = ("the store cannot write",) if wal_elsewhere else ("write-ahead log cannot write",
                                                                       "the store cannot write")
            assert any(c in reason for c in causes), reason
            assert "No space left on device" in reason, reason
            filler.unlink()  # space is back
            assert wait_for(lambda: c.get(f"{url}/healthz").status_code == 200, 30, 0.3)
            for req in refused:
                assert wait_for(lambda req=req: _post(c, url, req) == 200, 30, 0.5)
                acked |= span_keys(req)
        stored = _all_stored(url, acked, 60)
        assert sorted(stored) == sorted(acked)
        code, err = stop(proc)
        proc = None
        assert code == 0, err
        assert "no transaction is active" not in err
        assert "No space left on device" in err  # the real cause is logged
    finally:
        if proc is not None:
            stop(proc)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
