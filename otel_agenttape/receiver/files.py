"""OTLP files into the store for ``agenttape ingest`` and the read model: read and decoded by
``codec.otlp_files`` (JSON, JSON lines, protobuf, gzip), validated as the receiver validates a request."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from otel_agenttape.codec.otlp_decode import LOGS, PROTOBUF, TRACES, DecodeError
from otel_agenttape.codec.otlp_files import Decoded, decode_otlp_file, decode_request
from otel_agenttape.receiver.validation import Validated, validate_logs, validate_traces


def _validated(decoded: Decoded) -> tuple[str, Validated]:
    validate = validate_logs if decoded.signal == LOGS else validate_traces
    return decoded.signal, validate(decoded.request, decoded.problems)


def read_otlp_file(path: str | os.PathLike[str], signal: str | None = None) -> list[tuple[str, Validated]]:
    """``(signal, validated request)`` for every request in the file (``codec.otlp_files.decode_otlp_file``);
    items the store cannot hold are rejected as the receiver rejects them. Raises ``DecodeError``."""
    return [_validated(d) for d in decode_otlp_file(path, signal)]


def read_outbox_folder(path: str | os.PathLike[str]) -> list[tuple[str, Validated]]:
    """The records not yet acknowledged in an outbox folder (``otel_agenttape.outboxfile``), each an
    OTLP trace request (its ``logs`` folder: log requests), decoded and validated like a file; the
    folder is only read."""
    from otel_agenttape import outboxfile

    if not outboxfile.is_outbox(path):
        raise DecodeError(f"{path}: a folder, but not an outbox (no lane-* folders)")
    out = []
    signals = {outboxfile.KIND_TRACES: TRACES, outboxfile.KIND_LOGS: LOGS}
    try:
        for rec in [*outboxfile.read_outbox(path), *outboxfile.read_outbox(Path(path) / outboxfile.LOGS_FOLDER)]:
            if rec.kind not in signals:
                raise DecodeError(f"{path}: record of unknown kind {rec.kind}")
            try:
                out.append(_validated(decode_request(signals[rec.kind], rec.payload, PROTOBUF)))
            except DecodeError as exc:
                raise DecodeError(f"{path}: segment {rec.segment} offset {rec.offset}: {exc}") from None
    except outboxfile.OutboxFormatError as exc:
        raise DecodeError(str(exc)) from None
    return out


def _post(url: str, token: str | None, payload: bytes, attempts: int = 8) -> bytes:
    import time
    import urllib.error
    import urllib.request

    headers = {"Content-Type": PROTOBUF}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    for attempt in range(attempts):
        req = urllib.request.Request(url, data=payload, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code in (429, 502, 503, 504) and attempt + 1 < attempts:
                retry = exc.headers.get("Retry-After", "1")
                time.sleep(float(retry) if retry.replace(".", "", 1).isdigit() else 1.0)
                continue
            raise OSError(f"{url}: HTTP {exc.code}: {exc.read()[:300]!r}") from None
    raise OSError(f"{url}: gave up after {attempts} attempts")


def ingest_files(
    files: list[str], db: str, signal: str | None = None, batch_requests: int = 64
) -> dict[str, Any]:
    """Load OTLP files into ``db``; through the running server when one holds the file.

    Every file is decoded and validated before anything is written, so a bad file changes nothing.
    ``duplicates`` (records already stored) is None through a server: its response does not say, and
    the server counts them itself (``agenttape_spans_duplicate_total`` on ``/metrics``).
    """
    from otel_agenttape.receiver.server import read_discovery

    loaded: list[tuple[str, Validated]] = []
    for f in files:
        loaded.extend(read_outbox_folder(f) if Path(f).is_dir() else read_otlp_file(f, signal))
    rejected = sum(v.rejected for _, v in loaded)
    messages = sorted({v.message for _, v in loaded if v.message})
    summary: dict[str, Any] = {
        "files": len(files),
        "spans": sum(v.accepted for s, v in loaded if s == TRACES),
        "logs": sum(v.accepted for s, v in loaded if s == LOGS),
        "rejected": rejected,
        "duplicates": 0,
        "message": "; ".join(messages),
        "target": db,
    }
    holder = read_discovery(db)
    if holder is not None:
        summary["target"] = holder["url"]
        summary["duplicates"] = None
        for sig, v in loaded:
            if v.accepted:
                _post(f"{holder['url']}/v1/{sig}", holder.get("token"), v.request.SerializeToString())
        return summary
    from otel_agenttape.store.writer import Store

    import duckdb

    store = Store(db)  # StoreOpenError (an OSError) when the file cannot be opened
    try:
        for sig in (TRACES, LOGS):
            reqs = [v.request for s, v in loaded if s == sig and v.accepted]
            for i in range(0, len(reqs), batch_requests):
                chunk = reqs[i : i + batch_requests]
                res = store.write_traces(chunk) if sig == TRACES else store.write_logs(chunk)
                summary["duplicates"] += int(getattr(res, "duplicates", 0) or 0)
    except duckdb.Error as exc:  # e.g. disk full: the batch's transaction was rolled back
        raise OSError(f"cannot write to {db}: {exc}") from None
    finally:
        store.close()
    return summary


class OtlpFileError(Exception):
    """An OTLP file that cannot be read or decoded; the message is meant for the user."""


def load_otlp_files(paths: Sequence[str]) -> Any:
    """An in-memory ``Store`` holding the spans and log records of these OTLP files, decoded and
    validated as the receiver does (so a tape replays straight from an exporter's file)."""
    from otel_agenttape.store.writer import Store

    store = Store(None)
    try:
        for path in paths:
            for signal, validated in read_otlp_file(path):
                if signal == LOGS:
                    store.write_logs([validated.request])
                else:
                    store.write_traces([validated.request])
    except (OSError, DecodeError) as exc:
        store.close()
        raise OtlpFileError(str(exc)) from None
    return store
