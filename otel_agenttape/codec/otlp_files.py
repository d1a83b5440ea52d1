"""OTLP files read as requests: one JSON request, JSON lines (the Collector's file exporter), or one
protobuf request, each optionally gzip-compressed; decoded as the receiver decodes a request body."""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from otel_agenttape.codec.otlp_decode import JSON, LOGS, PROTOBUF, TRACES, DecodeError, decode_logs, decode_traces


@dataclass
class Decoded:
    """One request of a file: its signal (``traces`` or ``logs``), the decoded request message, and the
    items left out while decoding, by reason (OTLP JSON ids that are not hex)."""

    signal: str
    request: Any
    problems: dict[str, int]


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


def decode_request(signal: str, body: bytes, media: str) -> Decoded:
    """One request body decoded; JSON items whose ids are not hex are left out, counted in ``problems``."""
    problems: dict[str, int] = {}
    if signal == LOGS:
        return Decoded(signal, decode_logs(body, media, problems), problems)
    return Decoded(signal, decode_traces(body, media, problems), problems)


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


def decode_otlp_file(path: str | os.PathLike[str], signal: str | None = None) -> list[Decoded]:
    """Every request in the file, decoded; raises ``DecodeError``.

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


def _read_json(p: Path, data: bytes) -> list[Decoded]:
    out = []
    for n, raw, doc in _json_documents(p, data):
        if not isinstance(doc, dict) or not any(k in doc for k in _OTLP_JSON_KEYS):
            # e.g. {"foo": 1} or a capture JSONL file: it would decode as an empty request
            raise _not_otlp(f"{p}:{n}" if n is not None else str(p), doc)
        sig = _json_signal(doc)
        try:
            out.append(decode_request(sig, raw, JSON))
        except DecodeError as exc:
            raise DecodeError(f"{p}:{n}: {exc}" if n is not None else f"{p}: {exc}") from None
    return out


def _read_protobuf(p: Path, data: bytes, signal: str | None) -> list[Decoded]:
    sig = signal or (LOGS if "log" in p.name.lower() else TRACES)
    try:
        decoded = decode_request(sig, data, PROTOBUF)
    except DecodeError as exc:
        raise DecodeError(f"{p}: {exc}") from None
    resources = decoded.request.resource_logs if sig == LOGS else decoded.request.resource_spans
    if not len(resources):  # bytes that parse only as unknown fields: not an export of this signal
        raise DecodeError(f"{p}: not an OTLP {sig} protobuf request (no resource {'logs' if sig == LOGS else 'spans'} "
                          f"in {len(data)} bytes; --signal says which signal a protobuf file holds)")
    return [decoded]
