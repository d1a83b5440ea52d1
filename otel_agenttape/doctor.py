"""``agenttape doctor``: one place that says whether recording and storing work, and what was lost.

It reads what each part already exposes (package versions, the OTLP export settings that ``setup()``
would use, the store file, a running receiver's ``/healthz`` and ``/metrics``) and reports every
counter of loss — rejected spans, store errors, conflicting re-sends, pending write-ahead log — so no
drop stays silent.

The rule for the exit code: doctor fails (exit 1) only on what is wrong now — a missing package, an
unusable signing key, no store, a receiver whose ``/healthz`` is not 200 (its reason is shown) or whose
``/metrics`` cannot be read, an ingest queue that is full right now. What went wrong before (spans
rejected, store writes that failed and were retried, requests refused while the queue was full,
conflicting re-sends) is listed as information with its counts and reasons: a receiver that refused
one bad span an hour ago is working now.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("otel-agenttape", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http",
             "opentelemetry-exporter-otlp-proto-grpc", "opentelemetry-proto", "protobuf", "duckdb", "pyarrow")
_LOSS_METRICS = ("agenttape_spans_rejected_total", "agenttape_logs_rejected_total",
                 "agenttape_store_errors_total", "agenttape_parquet_errors_total", "agenttape_backpressure_total",
                 "agenttape_spans_conflicting_total", "agenttape_wal_write_errors")
_INFO_METRICS = ("agenttape_spans_accepted_total", "agenttape_spans_stored_total",
                 "agenttape_spans_duplicate_total", "agenttape_spans_conflicting_total", "agenttape_wal_lag_records",
                 "agenttape_queue_bytes")
_PAST = {  # loss counter -> how doctor names it
    "agenttape_spans_rejected_total": "spans rejected",
    "agenttape_logs_rejected_total": "log records rejected",
    "agenttape_store_errors_total": "store writes failed (retried from the write-ahead log)",
    "agenttape_wal_write_errors": "write-ahead log writes failed (those requests got 503 and are retried by the client)",
    "agenttape_backpressure_total": "requests refused with 429 while the queue was full (retried by the client)",
    "agenttape_parquet_errors_total": "Parquet lake writes failed (DuckDB holds the rows)",
}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    data: dict[str, Any] = field(default_factory=dict)
    info: bool = False  # a report (past losses), never a failure

    @property
    def status(self) -> str:
        """``ok``, ``FAIL`` (wrong now: doctor exits 1) or ``info`` (happened before)."""
        return "info" if self.info else "ok" if self.ok else "FAIL"


def _versions() -> Check:
    found: dict[str, str] = {}
    missing = []
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    try:
        from google.protobuf.internal import api_implementation

        found["protobuf backend"] = api_implementation.Type()
    except Exception:  # pragma: no cover - very old protobuf
        pass
    detail = ", ".join(f"{k} {v}" for k, v in found.items())
    if missing:
        detail += f"; missing: {', '.join(missing)}"
    return Check("packages", not missing, detail, found)


def _compiled() -> Check:
    """Which compiled fast paths run: without them everything works, only slower."""
    from otel_agenttape import native

    found = native.status()
    missing = [n for n, state in found.items() if state != "compiled"]
    detail = "; ".join(f"{native.MODULES[n]}: {state}" for n, state in found.items())
    if missing and not native.DISABLED:
        detail += " (reinstall with a C compiler and the Python headers to build them)"
    return Check("compiled paths", True, detail, found)


def _export_settings() -> Check:
    env = {k: ("<set>" if "HEADERS" in k else v) for k, v in sorted(os.environ.items())
           if k.startswith("OTEL_EXPORTER_OTLP") or k.startswith("AGENTTAPE_")}
    endpoint = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or "http://localhost:4318 (the exporter's default)")
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf")
    return Check("export settings", True, f"setup() without arguments exports to {endpoint} over {protocol}", env)


def _zero_code() -> Check:
    """What ``opentelemetry-instrument`` (or ``register()``) would set up in a process started with this
    environment: the same resolution and the same one-line description the distro prints."""
    from otel_agenttape.capture import distro
    from otel_agenttape.capture.settings import SettingsError, resolve

    try:
        settings = resolve()
    except SettingsError as exc:
        return Check("zero-code configuration", False, f"an instrumented process would not record: {exc}")
    enabled, skipped = distro.planned(settings)
    data = {name: ("<set>" if name == "headers" and value else value) for name, value in settings.values.items()}
    data["sources"] = dict(settings.sources)
    return Check("zero-code configuration", True, distro.describe(settings, enabled=enabled, skipped=skipped), data)


def _signing_key() -> Check | None:
    """When ``AGENTTAPE_SIGNING_KEY`` is set, it must be a readable private key: otherwise ``setup()``
    records unsealed (with a warning) instead of signing checkpoints."""
    from otel_agenttape.integrity.note import NoteError, Signer

    value = os.environ.get("AGENTTAPE_SIGNING_KEY")
    if not value:
        return None
    where = "AGENTTAPE_SIGNING_KEY"
    try:
        if value.startswith("PRIVATE+KEY+"):
            text = value
        else:
            where = f"AGENTTAPE_SIGNING_KEY={value}"
            text = Path(value).read_text(encoding="utf-8").strip()
        signer = Signer.parse(text)
    except OSError as exc:
        return Check("signing key", False, f"{where}: cannot read it ({exc.strerror or exc}); "
                                           f"sealing is off until it points at a key from `agenttape keygen`")
    except (UnicodeDecodeError, NoteError) as exc:
        why = "not a text file" if isinstance(exc, UnicodeDecodeError) else str(exc)
        return Check("signing key", False, f"{where}: not a private signing key ({why}); sealing is off until "
                                           f"it points at the PREFIX.key file of `agenttape keygen`")
    vkey = signer.verifier().vkey()
    return Check("signing key", True, f"{where}: key {signer.name}; verify with --key {vkey}", {"vkey": vkey})


def _scrape(url: str, token: str | None) -> dict[str, dict[str, float]]:
    """Every series of ``/metrics``: {metric name: {label text: value}} (label text "" when unlabelled)."""
    req = urllib.request.Request(url.rstrip("/") + "/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=5) as resp:  # loopback: the discovery file's URL
        text = resp.read().decode("utf-8", "replace")
    series: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        try:
            series.setdefault(name, {})[labels.rstrip("}")] = float(value)
        except ValueError:
            continue
    return series


def _reasons(labelled: dict[str, float]) -> str:
    """``invalid_id: 3, bad_timestamp: 1`` from the ``reason`` labels of one counter."""
    parts = []
    for labels, v in sorted(labelled.items()):
        if v:
            reason = labels.split('reason="', 1)[1].split('"', 1)[0] if 'reason="' in labels else labels
            parts.append(f"{reason}: {int(v)}" if reason else str(int(v)))
    return ", ".join(parts)


def _health(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode("utf-8", "replace").strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace").strip()


def _outbox() -> Check | None:
    """The outbox named by ``AGENTTAPE_OUTBOX``: spans (and log records) waiting to be re-sent, and what
    it dropped."""
    from otel_agenttape import outboxfile

    path = os.environ.get("AGENTTAPE_OUTBOX")
    if not path:
        return None
    try:
        s = outboxfile.summarize(path)
        logs = outboxfile.summarize(os.path.join(path, outboxfile.LOGS_FOLDER))
    except (OSError, ValueError) as exc:
        return Check("outbox", False, f"{path}: cannot read it: {exc}")
    detail = (f"{path}: {s.spans} spans in {s.records} records waiting to be re-sent ({s.bytes} bytes, "
              f"{s.lanes} lanes, {s.lanes_in_use} held by a running process), {s.dropped} dropped because it "
              f"was full, {s.torn_bytes} torn bytes")
    if logs.lanes:
        detail += (f"; {logs.spans} log records waiting in {outboxfile.LOGS_FOLDER}/ ({logs.bytes} bytes), "
                   f"{logs.dropped} dropped")
    if (s.spans and not s.lanes_in_use) or (logs.spans and not logs.lanes_in_use):
        detail += f"; deliver them with `agenttape ingest {path}` or by starting an agent with this outbox"
    data = dict(s.__dict__, log_records=logs.spans, log_records_dropped=logs.dropped)
    return Check("outbox", s.dropped == 0 and logs.dropped == 0, detail, data)


def _served(db: str, info: dict[str, Any]) -> list[Check]:
    url, token = info.get("url"), info.get("token")
    checks: list[Check] = []
    try:
        status, reason = _health(url)
    except (urllib.error.URLError, OSError) as exc:
        return [Check("receiver", False, f"{db} is announced by pid {info.get('pid')} at {url}, "
                                         f"but /healthz failed: {exc}")]
    healthy = status == 200
    checks.append(Check("receiver", healthy, f"pid {info.get('pid')} serves {db} at {url}; /healthz {status}"
                                              + ("" if healthy else f": {reason}"), {"healthz": status,
                                                                                     "reason": reason}))
    try:
        series = _scrape(url, token)
    except (urllib.error.URLError, OSError) as exc:
        checks.append(Check("receiver metrics", False, f"/metrics failed: {exc}"))
        return checks
    totals = {name: sum(v.values()) for name, v in series.items()}
    values = {k: totals.get(k, 0.0) for k in (*_INFO_METRICS, *_LOSS_METRICS)}
    detail = ", ".join(f"{k.removeprefix('agenttape_')}={int(totals.get(k, 0.0))}" for k in _INFO_METRICS)
    limit = totals.get("agenttape_queue_limit_bytes", 0.0)
    full = bool(limit) and totals.get("agenttape_queue_bytes", 0.0) >= limit
    checks.append(Check("receiver counters", not full, detail + ("; the ingest queue is full now (exports get 429)"
                                                                 if full else ""), values))
    memory = {part: totals.get(name) for part, name in (("total", "agenttape_memory_limit_bytes"),
                                                        ("store", "agenttape_store_memory_limit_bytes"),
                                                        ("queue", "agenttape_queue_limit_bytes"),
                                                        ("spool", "agenttape_spool_limit_bytes"),
                                                        ("reads", "agenttape_read_cache_limit_bytes"))}
    if memory["total"]:
        checks.append(Check("receiver memory", True, f"budget {int(memory['total']) >> 20} MB (--memory-limit): "
                            + ", ".join(f"{part} {int(v or 0) >> 20} MB" for part, v in memory.items()
                                        if part != "total")
                            + "; the process itself takes about 150 MB more" + _converters(totals), memory))
    past = []
    for name, label in _PAST.items():
        n = totals.get(name, 0.0)
        if n:
            why = _reasons(series.get(name, {}))
            past.append(f"{int(n)} {label}" + (f" ({why})" if why and ":" in why else ""))
    if past:
        checks.append(Check("past losses", True, "; ".join(past) + " — the receiver works now; these counts are "
                                                                  "since it started", values, info=True))
    conflicts = int(totals.get("agenttape_spans_conflicting_total", 0.0))
    if conflicts:
        checks.append(Check("conflicting spans", True, f"{conflicts} re-sent span id(s) came with other content than "
                                                       f"the stored span, which was kept: a client that reuses span ids, "
                                                       f"or tampering (the receiver log names one)",
                            {"agenttape_spans_conflicting_total": conflicts}, info=True))
    return checks


def _converters(totals: dict[str, float]) -> str:
    """The converter processes now, and when idle memory is given back (``receiver/quiet.py``)."""
    running = totals.get("agenttape_converter_processes")
    if running is None:
        return ""
    after = totals.get("agenttape_release_after_seconds", 0.0)
    quiet = (f"; after {after:g} s quiet they stop, and DuckDB's cached blocks, the kept reads and the "
             "libraries' resident pages are given back" if after
             else "; they keep running (--release-after 0)")
    return f"; {int(running)} converter process(es) running, about 70 MB each" + quiet


def _offline(db: str) -> list[Check]:
    from otel_agenttape.store.reader import StoreError, open_reader

    checks: list[Check] = []
    wal = Path(db + ".otlpwal")
    pending = sum(p.stat().st_size for p in wal.glob("*") if p.is_file()) if wal.is_dir() else 0
    if pending:
        checks.append(Check("write-ahead log", True, f"{pending} bytes in {wal}: applied (deduplicated) "
                                                     f"the next time `agenttape serve --db {db}` starts", info=True))
    try:
        reader = open_reader(db)
    except StoreError as exc:
        return checks + [Check("store", False, str(exc))]
    try:
        row = reader.query(
            "SELECT (SELECT count(*) FROM spans) AS spans, (SELECT count(*) FROM runs) AS runs, "
            "(SELECT count(DISTINCT chain_id) FROM spans WHERE chain_id IS NOT NULL) AS tapes, "
            "(SELECT count(*) FROM log_records) AS logs").to_pylist()[0]
    finally:
        reader.close()
    checks.append(Check("store", True, f"{db}: {row['spans']} spans, {row['runs']} runs, {row['tapes']} sealed "
                                       f"tapes, {row['logs']} log records", row))
    return checks


def diagnose(db: str) -> list[Check]:
    """Every check, in the order a person reads them."""
    from otel_agenttape.receiver.server import read_discovery

    checks = [_versions(), _compiled(), _export_settings(), _zero_code()]
    key = _signing_key()
    if key is not None:
        checks.append(key)
    box = _outbox()
    if box is not None:
        checks.append(box)
    info = read_discovery(db)
    if info is not None:
        checks += _served(db, info)
    elif os.path.exists(db):
        checks += _offline(db)
    else:
        checks.append(Check("store", False, f"no store at {db}: run `agenttape serve --db {db}` "
                                            f"(or `agenttape demo --db {db}`) first"))
    return checks
