"""Reading OTLP files for ``agenttape ingest``: one JSON request, JSON lines (the Collector's file
exporter), or one protobuf request, each optionally gzip-compressed. Same decoding and validation as
the receiver."""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from otel_agenttape.receiver.decode import (
    JSON,
    PROTOBUF,
    DecodeError,
    Validated,
    decode_logs,
    decode_traces,
    validate_logs,
    validate_traces,
)
from otel_agenttape.receiver.service import LOGS, TRACES


def _load(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise DecodeError(f"{path}: invalid gzip: {exc}") from None
    return data


def _json_signal(doc: Any) -> str:
    if isinstance(doc, dict) and ("resourceLogs" in doc or "resource_logs" in doc):
        return LOGS
    return TRACES


def _decode(signal: str, body: bytes, media: str) -> Validated:
    problems: dict[str, int] = {}  # items whose ids are not hex: rejected like the receiver rejects them
    if signal == LOGS:
        return validate_logs(decode_logs(body, media, problems), problems)
    return validate_traces(decode_traces(body, media, problems), problems)


_JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
_PROTOBUF_SUFFIXES = (".pb", ".binpb", ".protobuf", ".proto", ".bin")
_BOM = b"\xef\xbb\xbf"


def _format_by_name(path: Path) -> str | None:
    """``json`` or ``protobuf`` from the name (``.json``/``.jsonl``, ``.pb``/``.binpb``..., before ``.gz``)."""
    name = path.name.lower()
    for gz in (".gz", ".gzip"):
        name = name.removesuffix(gz)
    if name.endswith(_JSON_SUFFIXES):
        return "json"
    if name.endswith(_PROTOBUF_SUFFIXES):
        return "protobuf"
    return None


def _json_documents(p: Path, data: bytes) -> list[tuple[int | None, bytes, Any]]:
    """``(line number or None, raw, parsed)`` of one JSON document, or of each line of JSON lines."""
    try:
        return [(None, data, orjson.loads(data))]
    except orjson.JSONDecodeError as whole:
        lines = [(n, line) for n, line in enumerate(data.splitlines(), 1) if line.strip()]
        if len(lines) < 2 or not all(line.lstrip().startswith(b"{") for _, line in lines):
            raise DecodeError(f"{p}: invalid JSON: {whole}") from None
    docs: list[tuple[int | None, bytes, Any]] = []
    for n, line in lines:
        try:
            docs.append((n, line, orjson.loads(line)))
        except orjson.JSONDecodeError as exc:
            raise DecodeError(f"{p}:{n}: invalid JSON: {exc}") from None
    return docs


def read_otlp_file(path: str | os.PathLike[str], signal: str | None = None) -> list[tuple[str, Validated]]:
    """``(signal, validated request)`` for every request in the file; raises ``DecodeError``.

    JSON or protobuf is told by the name (``.json``, ``.jsonl``, ``.pb``, ``.binpb``... before ``.gz``),
    else by the content. ``signal`` forces ``traces`` or ``logs`` for protobuf files (JSON says which it is); by default a
    protobuf file is read as logs when its name contains ``log``, else as traces. An empty file is an
    error: it is more likely a failed export than an export of nothing.
    """
    p = Path(path)
    data = _load(p)
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    if not data.strip():
        raise DecodeError(f"no OTLP data in {p} (the file is empty)")
    fmt = _format_by_name(p)
    if fmt == "json":
        return _read_json(p, data)
    if fmt == "protobuf" or data.lstrip()[:1] != b"{":
        return _read_protobuf(p, data, signal)
    try:
        return _read_json(p, data)
    except DecodeError:
        # a protobuf request starts with "\n<length>"; a length of 123 reads as "\n{"
        if data[:1] == b"\n":
            try:
                return _read_protobuf(p, data, signal)
            except DecodeError:
                pass
        raise


_OTLP_JSON_KEYS = ("resourceSpans", "resource_spans", "resourceLogs", "resource_logs")


def _not_otlp(where: str, doc: Any) -> DecodeError:
    found = f"keys: {', '.join(sorted(map(str, doc))[:5])}" if isinstance(doc, dict) else f"a JSON {type(doc).__name__}"
    return DecodeError(f"{where}: not an OTLP export (an OTLP JSON document holds resourceSpans or resourceLogs; "
                       f"found {found or 'an empty object'})")


def _read_json(p: Path, data: bytes) -> list[tuple[str, Validated]]:
    out = []
    for n, raw, doc in _json_documents(p, data):
        if not isinstance(doc, dict) or not any(k in doc for k in _OTLP_JSON_KEYS):
            # e.g. {"foo": 1} or a capture JSONL file: it would decode as an empty request
            raise _not_otlp(f"{p}:{n}" if n is not None else str(p), doc)
        sig = _json_signal(doc)
        try:
            out.append((sig, _decode(sig, raw, JSON)))
        except DecodeError as exc:
            raise DecodeError(f"{p}:{n}: {exc}" if n is not None else f"{p}: {exc}") from None
    return out


def _read_protobuf(p: Path, data: bytes, signal: str | None) -> list[tuple[str, Validated]]:
    sig = signal or (LOGS if "log" in p.name.lower() else TRACES)
    try:
        v = _decode(sig, data, PROTOBUF)
    except DecodeError as exc:
        raise DecodeError(f"{p}: {exc}") from None
    resources = v.request.resource_logs if sig == LOGS else v.request.resource_spans
    if not len(resources):  # bytes that parse only as unknown fields: not an export of this signal
        raise DecodeError(f"{p}: not an OTLP {sig} protobuf request (no resource {'logs' if sig == LOGS else 'spans'} "
                          f"in {len(data)} bytes; --signal says which signal a protobuf file holds)")
    return [(sig, v)]


def read_outbox_folder(path: str | os.PathLike[str]) -> list[tuple[str, Validated]]:
    """The records not yet acknowledged in an outbox folder (``otel_agenttape.outboxfile``), each an
    OTLP trace request, decoded and validated like a file; the folder is only read."""
    from otel_agenttape import outboxfile

    if not outboxfile.is_outbox(path):
        raise DecodeError(f"{path}: a folder, but not an outbox (no lane-* folders)")
    out = []
    try:
        for rec in outboxfile.read_outbox(path):
            if rec.kind != outboxfile.KIND_TRACES:
                raise DecodeError(f"{path}: record of unknown kind {rec.kind}")
            try:
                out.append((TRACES, _decode(TRACES, rec.payload, PROTOBUF)))
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
