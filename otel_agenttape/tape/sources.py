"""Open what a rebuild reads from: a DuckDB store, a Parquet lake, or OTLP files.

OTLP files (JSON, JSON lines, protobuf, gzip) are decoded and validated like the receiver does
and loaded into an in-memory store, so a tape can be replayed straight from an exporter's file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


class SourceError(Exception):
    """A source cannot be opened; the message is meant for the user."""


class _OwnedReader:
    """A reader that also closes the in-memory store it reads."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._reader = store.reader()

    def query(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        return self._reader.query(sql, params)

    def close(self) -> None:
        self._reader.close()
        self._store.close()


def load_otlp_files(paths: Sequence[str]) -> Any:
    """An in-memory ``Store`` holding the spans and log records of these OTLP files."""
    from ..receiver.decode import DecodeError
    from ..receiver.files import read_otlp_file
    from ..receiver.service import LOGS
    from ..store.writer import Store

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
        raise SourceError(str(exc)) from None
    return store


def open_source(db: str | None = None, parquet: str | None = None, otlp: Sequence[str] | None = None) -> Any:
    """A reader over OTLP files if given, else a Parquet lake, else a DuckDB store."""
    from ..store.reader import StoreError, open_lake, open_reader

    if otlp:
        return _OwnedReader(load_otlp_files(otlp))
    try:
        if parquet:
            if not os.path.isdir(parquet):
                raise SourceError(f"no Parquet lake at {parquet}")
            return open_lake(parquet)
        if not db:
            raise SourceError("no source: give --db, --parquet or --otlp")
        return open_reader(db)  # a DuckDB file, or a Parquet lake folder given as --db
    except StoreError as exc:
        raise SourceError(str(exc)) from None
