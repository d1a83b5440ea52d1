"""What a receiver gives back after a quiet spell: the memory that only served the busy time.

A sidecar receiver is idle most of the day. After ``after`` seconds (``serve --release-after``, 60 by
default) in which nothing was stored, nothing read the store and nothing went to the converter
processes, the writer thread (which looks once a second while it waits for work) gives back, once
per quiet spell:

- the converter processes (``ConvertPool.stop``): each is an interpreter of its own with the
  decoding code loaded, about 70 MB, and their hand-off files in shared memory;
- the blocks DuckDB keeps cached in its buffer manager (``Store.release_memory``);
- what the read model keeps between the console's and the API's reads (every run's keys, summaries,
  latest scores: ``read_memory.release``, about 17 MB on a store of 100,000 runs);
- freed memory that Arrow's allocator and the C allocator keep for reuse (``release_unused``,
  glibc's ``malloc_trim``);
- the resident pages of the library files it maps, DuckDB's, Arrow's and gRPC's code above all
  (``code_pages.page_out``: the kernel reclaims them as memory pressure would, about 90 MB).

Each comes back when it is needed: the converters at the next backlog, or at the next request for a
server that keeps them running (``ConvertPool.restart_on_use``); until they run, requests are
prepared in the main process, as before they first started. Cached blocks are read again from the
file (the OS page cache usually still holds it), the read model keeps again as it reads, and code
pages are read back as the code runs (the first request after a release pays those page faults).
``bench/idle_memory.py`` measures what this gives, and what the next request takes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, ContextManager

from otel_agenttape import read_memory
from otel_agenttape.receiver.code_pages import page_out
from otel_agenttape.receiver.prepare import release_memory as release_allocators

log = logging.getLogger(__name__)

DEFAULT_RELEASE_AFTER = 60.0


class QuietRelease:
    """Releases a receiver's idle memory once per quiet spell of ``after`` seconds (0: never)."""

    def __init__(self, store: Any, pool: Any, after: float, metrics: Any = None) -> None:
        self.store = store
        self.pool = pool
        self.after = float(after)
        self.metrics = metrics
        self._last_write = time.monotonic()
        self._released_at = float("-inf")  # when the last release ran (a release per quiet spell)
        # what must hold still while the store's limit is low: queries on cursors of their own, outside
        # the store's read gate (the lake publisher's; the server sets it)
        self.hold: Callable[[], ContextManager[Any]] | None = None

    def stored(self) -> None:
        """A write reached the store: the quiet spell starts again."""
        self._last_write = time.monotonic()

    def last_activity(self) -> float:
        """``time.monotonic()`` of the latest write, read or converter use (now while a read runs)."""
        last = self._last_write
        gate = getattr(self.store, "gate", None)
        if gate is not None:
            last = max(last, gate.last_read())
        if self.pool is not None:
            last = max(last, self.pool.last_used)
        return last

    def check(self) -> dict[str, int] | None:
        """Release (``release``) when the receiver has been quiet for ``after`` seconds and nothing was
        released since it last did something; returns what was released, or None."""
        if self.after <= 0:
            return None
        now = time.monotonic()
        last = self.last_activity()
        if now - last < self.after or self._released_at >= last:
            return None
        self._released_at = now
        return self.release()

    def release(self) -> dict[str, int]:
        """Give back the idle memory now; returns ``{"converters": n stopped, "store_bytes": n,
        "read_bytes": n, "code_bytes": n}``."""
        out = {"converters": 0, "store_bytes": 0, "read_bytes": 0, "code_bytes": 0}
        if self.pool is not None and self.pool.stop(quiet_seconds=self.after):
            out["converters"] = self.pool.workers
        release_memory = getattr(self.store, "release_memory", None)
        if release_memory is not None:
            try:
                with self.hold() if self.hold is not None else contextlib.nullcontext():
                    out["store_bytes"] = int(release_memory())
            except Exception as exc:  # noqa: BLE001 - memory merely stays cached
                log.warning("could not release the store's cached blocks: %s", exc)
        out["read_bytes"] = read_memory.release()
        release_allocators()  # Arrow's pool and glibc's heap (prepare.py: a converter does it too)
        out["code_bytes"] = page_out()
        if self.metrics is not None:
            self.metrics.inc("agenttape_quiet_releases_total")
            self.metrics.inc("agenttape_quiet_released_store_bytes_total", out["store_bytes"])
            self.metrics.inc("agenttape_quiet_released_read_bytes_total", out["read_bytes"])
            self.metrics.inc("agenttape_quiet_released_code_bytes_total", out["code_bytes"])
        log.info("quiet for %.0f s: stopped %d converter(s), released %d MB of cached store blocks, %d MB "
                 "of kept reads and %d MB of library pages", self.after, out["converters"],
                 out["store_bytes"] >> 20, out["read_bytes"] >> 20, out["code_bytes"] >> 20)
        return out

