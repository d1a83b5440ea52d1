"""Open what a command reads from: a DuckDB store, a Parquet lake, or OTLP files.

OTLP files (JSON, JSON lines, protobuf, gzip) are decoded and validated like the receiver does
and loaded into an in-memory store, so a tape can be replayed straight from an exporter's file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from otel_agenttape.cli import CliError


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


def open_source(db: str | None = None, parquet: str | None = None, otlp: Sequence[str] | None = None) -> Any:
    """A reader over OTLP files if given, else a Parquet lake, else a DuckDB store (or a lake as --db)."""
    from otel_agenttape.receiver.files import OtlpFileError, load_otlp_files
    from otel_agenttape.store.reader import StoreError, open_lake, open_reader

    try:
        if otlp:
            return _OwnedReader(load_otlp_files(otlp))
        if parquet:
            if not os.path.isdir(parquet):
                raise CliError(f"no Parquet lake at {parquet}")
            return open_lake(parquet)
        if not db:
            raise CliError("no source: give --db, --parquet or --otlp")
        return open_reader(db)
    except (StoreError, OtlpFileError) as exc:
        raise CliError(str(exc)) from None


def open_args(args: Any) -> Any:
    """``open_source`` from a command's ``--db``, ``--parquet`` and ``--otlp`` options."""
    return open_source(getattr(args, "db", None), getattr(args, "parquet", None), getattr(args, "otlp", None))


def source_of(args: Any) -> Any:
    """What ``--otlp``, ``--parquet`` or ``--db`` names, for ``otel_agenttape.open``."""
    otlp, parquet, db = getattr(args, "otlp", None), getattr(args, "parquet", None), getattr(args, "db", None)
    if otlp:
        return list(otlp)
    if parquet:
        if not os.path.isdir(parquet):
            raise CliError(f"no Parquet lake at {parquet}")
        return parquet
    if not db:
        raise CliError("no source: give --db, --parquet or --otlp")
    return db


def open_tapes(args: Any) -> Any:
    """``otel_agenttape.open`` on a command's source; a source that cannot be read is a one-line error."""
    from otel_agenttape.receiver.files import OtlpFileError
    from otel_agenttape.sources import open as open_source_tapes
    from otel_agenttape.store.reader import StoreError

    try:
        return open_source_tapes(source_of(args))
    except (StoreError, OtlpFileError) as exc:
        raise CliError(str(exc)) from None
