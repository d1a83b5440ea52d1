"""How a receiver's memory is divided: one operator figure (``--memory-limit``) split into bounds.

A receiver's resident memory is the process itself (the interpreter, DuckDB, Arrow and gRPC code and
their threads: about 150 MB, measured by ``bench/idle_memory.py``) plus four parts that grow with
load or with the store, each bounded here: DuckDB's buffer manager (its ``memory_limit``), the
accepted requests that wait for the store (their rows, or their bodies while rows are still to be
built: past the bound a request gets 429), the converter hand-off files kept in shared memory for
reuse, and what the read model keeps between reads for the console and the API (runs' keys, summaries
and scores: ``read_memory.py``). ``agenttape doctor`` and ``/metrics`` show each bound. After a quiet
spell the converters stop and DuckDB's cached blocks go back to the system (``quiet.py``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

DEFAULT_MEMORY_LIMIT = 512 << 20
_MIN_MEMORY_LIMIT = 128 << 20
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str | int) -> int:
    """Bytes of ``512MB``, ``1.5GiB``, ``300M`` or a plain number; ``ValueError`` names what is wrong."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (say 512MB, 1GB or a number of bytes)")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class MemoryBudget:
    """The bounds of a receiver's memory, in bytes (see the module's docstring)."""

    total: int
    store: int  # DuckDB's memory_limit
    queue: int  # accepted requests not yet in the store
    spool: int  # converter hand-off files kept for reuse, both kinds together
    reads: int  # what the read model keeps between reads (read_memory.py)

    @classmethod
    def of(cls, total: int | str | None = None) -> MemoryBudget:
        """Split ``total`` (default 512 MB, at least 128 MB): a quarter each to DuckDB and the queue,
        a sixteenth to the spool, an eighth to the read model, the rest (5/16) to the process itself."""
        n = DEFAULT_MEMORY_LIMIT if total is None else parse_size(total)
        if n < _MIN_MEMORY_LIMIT:
            raise ValueError(f"a memory limit of {n >> 20} MB is below the {_MIN_MEMORY_LIMIT >> 20} MB "
                             "a receiver needs (the process alone takes about 150 MB)")
        return cls(total=n, store=n // 4, queue=n // 4, spool=n // 16, reads=n // 8)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
