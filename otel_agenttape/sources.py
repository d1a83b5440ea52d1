"""``otel_agenttape.open(source)``: a ``Tapes`` over whatever holds the tapes.

A DuckDB file (read-only; through the running ``agenttape serve`` that holds it, found by its discovery
file), a Parquet lake folder, one or more OTLP files (decoded and validated as the receiver does, into
memory), a server URL or its discovery file (``<db>.serve.json``), a ``Store``, or any reader.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from otel_agenttape.tape.read import Tapes

_OTLP_SUFFIXES = (".json", ".jsonl", ".ndjson", ".pb", ".binpb", ".protobuf", ".otlp", ".gz", ".gzip")
DISCOVERY_SUFFIX = ".serve.json"


def _is_otlp_file(path: str) -> bool:
    name = Path(path).name.lower()
    return not name.endswith(DISCOVERY_SUFFIX) and name.endswith(_OTLP_SUFFIXES) and os.path.isfile(path)


def _otlp(paths: Sequence[str]) -> Tapes:
    from otel_agenttape.receiver.files import load_otlp_files

    store = load_otlp_files([os.fspath(p) for p in paths])
    return Tapes(store.reader(), closer=store.close)


def _discovered(path: str, token: str | None) -> Tapes:
    from otel_agenttape.store.reader import HttpReader, StoreError

    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"unreadable server discovery file {path}: {exc}") from exc
    if not isinstance(info, dict) or not info.get("url"):
        raise StoreError(f"server discovery file {path} has no url")
    return Tapes(HttpReader(str(info["url"]), token=token or info.get("token"),
                            description=f"{path} via {info['url']}"))


def open(source: Any, *, token: str | None = None) -> Tapes:  # noqa: A001 - the package's verb, as sqlite-utils
    """Open tapes for reading; use as a context manager (``with otel_agenttape.open(...) as tapes``)."""
    from otel_agenttape.store.reader import HttpReader, Reader, open_reader
    from otel_agenttape.store.writer import Store

    if isinstance(source, Tapes):
        return source
    if isinstance(source, Store):
        return Tapes(source.reader())
    if isinstance(source, Reader) or (hasattr(source, "query") and not isinstance(source, (str, os.PathLike))):
        return Tapes(source, owns=False)
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("open([]): no OTLP files given")
        return _otlp(source)
    src = os.fspath(source)
    if src.startswith(("http://", "https://")):
        return Tapes(HttpReader(src, token=token))
    if src.endswith(DISCOVERY_SUFFIX) and os.path.isfile(src):
        return _discovered(src, token)
    if _is_otlp_file(src):
        return _otlp([src])
    return Tapes(open_reader(src))
