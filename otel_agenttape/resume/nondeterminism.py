"""Recorded nondeterminism: the time, random ids and numbers a prompt may contain.

A prompt that embeds the current time or a fresh uuid hashes differently on every run, so a resumed
run would miss every recorded call. Taking these values through the index records them on the first
run and replays them, in order, on a resumed run.
"""

from __future__ import annotations

import random as _random
import time as _time
import uuid as _uuid

from .index import ResumeIndex


def now(index: ResumeIndex) -> float:
    """``time.time()``, recorded."""
    return index.recorded_value("time", _time.time)


def time_ns(index: ResumeIndex) -> int:
    """``time.time_ns()``, recorded."""
    return index.recorded_value("time_ns", _time.time_ns)


def uuid4(index: ResumeIndex) -> str:
    """A random uuid (as text), recorded."""
    return index.recorded_value("uuid4", lambda: str(_uuid.uuid4()))


def random(index: ResumeIndex) -> float:
    """``random.random()``, recorded."""
    return index.recorded_value("random", _random.random)


class Recorded:
    """The helpers bound to one index, for a ``Tape`` to expose as ``tape.now()``, ``tape.uuid()``."""

    def __init__(self, index: ResumeIndex) -> None:
        self.index = index

    def now(self) -> float:
        return now(self.index)

    def time_ns(self) -> int:
        return time_ns(self.index)

    def uuid(self) -> str:
        return uuid4(self.index)

    def random(self) -> float:
        return random(self.index)
