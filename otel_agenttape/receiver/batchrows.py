"""Rows for a batch the store writer took from the queue: the items' own, or converted now.

Requests accepted before the converter pool ran (or through a store that takes messages) are
queued without rows; the writer converts them when it takes them, in the worker processes (chunks
of about ``chunk_items``) when the backlog is large, else in its own thread.
"""

from __future__ import annotations

import logging
from typing import Any

from otel_agenttape.receiver.wal import KIND_TRACES
from otel_agenttape.store import rows

log = logging.getLogger(__name__)


def batch_tables(batch: list[Any], pool: Any, pool_threshold: int, chunk_items: int) -> list[rows.Tables]:
    """The rows of a batch of queued items, in queue order."""
    todo = [it for it in batch if it.tables is None]
    converted = _convert(todo, pool, pool_threshold, chunk_items) if todo else {}
    return [it.tables if it.tables is not None else converted[id(it)]
            for it in batch if it.tables is not None or id(it) in converted]


def _convert(items: list[Any], pool: Any, pool_threshold: int, chunk_items: int) -> dict[int, rows.Tables]:
    """Rows for runs of same-kind items, keyed by the id of each run's first item."""
    pooled = pool is not None and sum(it.count for it in items) >= pool_threshold
    chunks: list[list[Any]] = []
    for it in items:
        last = chunks[-1] if chunks else None
        if last and last[0].kind == it.kind and (not pooled or sum(c.count for c in last) < chunk_items):
            last.append(it)
        else:
            chunks.append([it])
    futures: list[Any] = [None] * len(chunks)
    if pooled:
        try:
            futures = [pool.submit(chunk[0].kind, [it.payload for it in chunk]) for chunk in chunks]
        except Exception as exc:  # noqa: BLE001 - no workers: convert here
            log.warning("row conversion workers unavailable (%s); converting in the writer", exc)
            futures = [None] * len(chunks)
    out: dict[int, rows.Tables] = {}
    for chunk, future in zip(chunks, futures):
        tables = None
        if future is not None:
            try:
                tables = future.result()
            except Exception as exc:  # noqa: BLE001 - a broken worker: convert here instead
                log.warning("row conversion in a worker failed (%s); converting in the writer", exc)
        out[id(chunk[0])] = tables if tables is not None else _convert_here(chunk)
    return out


def _convert_here(chunk: list[Any]) -> rows.Tables:
    if chunk[0].kind == KIND_TRACES:
        return rows.traces_to_tables([it.payload for it in chunk])
    return rows.logs_to_tables([it.message() for it in chunk])
