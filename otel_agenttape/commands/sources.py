"""Open what a command reads from: a DuckDB store, a Parquet lake, a server, or OTLP files.

Every command reads through ``Tapes`` (``otel_agenttape.open``). OTLP files (JSON, JSON lines, protobuf,
gzip) are decoded and validated like the receiver does and loaded into an in-memory store, so a tape can be
replayed straight from an exporter's file.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, TypeVar

from otel_agenttape.commands.errors import CliError

T = TypeVar("T")


def store_errors() -> tuple[type[BaseException], ...]:
    """What reading or writing a store raises for the user to read (``errors.reported`` turns it into one line)."""
    from otel_agenttape.store.reader import StoreError

    return (StoreError, FileExistsError, OSError, ValueError)


def source_of(args: Any) -> Any:
    """What ``--otlp``, ``--lake``, ``--parquet`` or ``--db`` names, for ``otel_agenttape.open``."""
    otlp, parquet, db = getattr(args, "otlp", None), getattr(args, "parquet", None), getattr(args, "db", None)
    if otlp:
        return list(otlp)
    lake = getattr(args, "lake", None)
    if lake:  # lakes and DuckDB files read as one store (open() of a list without OTLP files)
        return list(lake)
    if parquet:
        if not os.path.isdir(parquet):
            raise CliError(f"no Parquet lake at {parquet}")
        return parquet
    if not db:
        raise CliError("no source: give --db, --parquet or --otlp")
    return db


def _one_line(open_: Callable[[], T]) -> T:
    from otel_agenttape.receiver.files import OtlpFileError
    from otel_agenttape.store.reader import StoreError

    try:
        return open_()
    except (StoreError, OtlpFileError) as exc:
        raise CliError(str(exc)) from None


def open_tapes(args: Any) -> Any:
    """``otel_agenttape.open`` on a command's source; a source that cannot be read is a one-line error."""
    from otel_agenttape.sources import open as open_source_tapes

    tapes = _one_line(lambda: open_source_tapes(source_of(args)))
    return with_prices(tapes, getattr(args, "prices", None))


def with_prices(tapes: Any, path: str | None) -> Any:
    """``tapes`` pricing with the ``--prices`` file (when given); a file that cannot be read is a one-line
    error."""
    if path:
        from otel_agenttape.pricing import PricesFileError

        try:
            tapes.use_prices(path)
        except PricesFileError as exc:
            tapes.close()
            raise CliError(str(exc)) from None
    return tapes


def open_args(args: Any) -> Any:
    """``Tapes`` over a command's source, each flag opened as what it names: ``--otlp`` files as OTLP whatever
    their names, ``--lake`` and ``--parquet`` as lakes (an exported folder read by its layout), ``--db`` as a
    store (the integrity commands read this way)."""
    from otel_agenttape.receiver.files import load_otlp_files
    from otel_agenttape.store.reader import open_lake, open_reader
    from otel_agenttape.tape.read import Tapes

    source = source_of(args)

    def open_() -> Any:
        if getattr(args, "otlp", None):
            store = load_otlp_files(source)
            return Tapes(store.reader(), closer=store.close)
        if getattr(args, "lake", None) or getattr(args, "parquet", None):
            return Tapes(open_lake(source))
        return Tapes(open_reader(source))

    return _one_line(open_)


def read(args: argparse.Namespace, fn: Callable[[Any], T]) -> T:
    """Run ``fn(tapes)`` on the command's source; an unknown or ambiguous run is a one-line error (exit 2)."""
    from otel_agenttape.tape.refs import AmbiguousRunError, RunNotFound

    tapes = open_tapes(args)
    try:
        return fn(tapes)
    except AmbiguousRunError as exc:
        raise CliError(f"{exc}\n" + "\n".join(f"  {c}" for c in exc.candidates)) from None
    except RunNotFound as exc:
        raise CliError(str(exc)) from None
    finally:
        tapes.close()
