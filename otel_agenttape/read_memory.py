"""What the read model keeps in memory between reads, and the one bound on all of it.

On a store with a version (``kept.store_version``) the read model keeps, until the version changes:
every run's keys (an Arrow table, about 165 bytes a run: 16.5 MB for 100,000 runs), each filter's
matching keys, the run summaries read so far (about ``SUMMARY_BYTES`` each), every run's latest
scores and the console's kept steps and trees (``Tapes.memo``). Pages are then cut from memory
instead of read again. All of it, over every reader of the process, stays under ``limit()`` bytes
(default 64 MiB; a receiver sets it to its ``--memory-limit`` share, ``receiver/memory.py``): keys,
scores or answers that would not fit are not kept, and the pages they would have served are read
from the store, as on a reader with no version; the oldest summaries go first. Nothing is left out
of an answer: only what is kept for the next one. ``release()`` lets go of all of it (a receiver
does after a quiet spell).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

DEFAULT_LIMIT = 64 << 20
SUMMARY_BYTES = 2048  # a kept run summary: 25 values in a dict (measured 1.9 KB with its own strings)
SCORE_BYTES = 512  # a kept latest score: value, label, explanation, source, ... in a dict

_limit = DEFAULT_LIMIT
_holders: list[tuple[Callable[[], int], Callable[[], None] | None]] = []
_lock = threading.Lock()


def limit() -> int:
    """Bytes the read model may keep in this process."""
    return _limit


def set_limit(nbytes: int) -> None:
    """Change the bound (a receiver: its ``--memory-limit`` share); what is kept now is trimmed as
    each holder next keeps something."""
    global _limit
    if nbytes < 0:
        raise ValueError("the read model's memory limit is 0 bytes or more")
    _limit = int(nbytes)


def register(size: Callable[[], int], drop: Callable[[], None] | None = None) -> None:
    """A holder of kept reads: ``size()`` says how many bytes it keeps now, ``drop()`` lets all of it go."""
    with _lock:
        _holders.append((size, drop))


def held() -> int:
    """Bytes kept now, over every holder."""
    return sum(size() for size, _ in list(_holders))


def release() -> int:
    """Let go of everything kept (a quiet receiver gives it back: ``receiver/quiet.py``); the next
    reads are answered from the store and keep again. Returns the bytes let go."""
    before = held()
    for _, drop in list(_holders):
        if drop is not None:
            drop()
    return max(0, before - held())


def fits(nbytes: int) -> bool:
    """Whether ``nbytes`` more can be kept."""
    return held() + nbytes <= _limit
