"""The code pages a quiet receiver hands back: resident pages of the files it maps (its libraries).

A receiver maps about 100 MB of library files: DuckDB (about 40 MB), Arrow, gRPC, the interpreter and
the extension modules. Once touched, their pages stay resident and count in its RSS for as long as it
runs, though a receiver with nothing to do runs almost none of that code. ``page_out()`` asks the
kernel to reclaim them now (``madvise(MADV_PAGEOUT)``, Linux 5.4 and later), as it would under memory
pressure: only clean pages of files that this process alone maps (a page another process maps stays,
and so does every page written to, such as a library's relocated data, which is anonymous memory).
The pages come back, from the page cache or the disk, the next time the code runs: the first request
after a quiet spell pays those page faults (``bench/idle_memory.py`` prints how long that request
takes, beside the same request before the release). Elsewhere ``page_out()`` does nothing and says 0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
from typing import Any

# the constant is Linux's own (include/uapi/asm-generic/mman-common.h) where the mmap module lacks it
MADV_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21 if sys.platform.startswith("linux") else None)


def _load_madvise() -> Any:
    if MADV_PAGEOUT is None:
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_madvise = _load_madvise()


def file_resident_bytes() -> int:
    """Resident bytes of this process's file mappings (``RssFile`` of ``/proc/self/status``), or 0."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"RssFile:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _private_file_mappings() -> list[tuple[int, int]]:
    """``(start, length)`` of each private mapping of a regular file (not shared memory, not a device)."""
    out = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            if len(parts) < 6:
                continue
            path = parts[5].rstrip("\n")
            if not path.startswith("/") or path.startswith(("/dev/", "/proc/", "/sys/")) or path.endswith(" (deleted)"):
                continue
            if parts[1][3:4] != "p":  # a shared mapping (a file written through memory): left alone
                continue
            lo, hi = parts[0].split("-")
            start = int(lo, 16)
            out.append((start, int(hi, 16) - start))
    return out


def page_out() -> int:
    """Ask the kernel to reclaim the resident pages of this process's file mappings; returns how many
    bytes of them it took back (``RssFile`` before less after), 0 where it cannot."""
    if _madvise is None:
        return 0
    before = file_resident_bytes()
    try:
        mappings = _private_file_mappings()
    except OSError:
        return 0
    for start, length in mappings:
        _madvise(start, length, MADV_PAGEOUT)  # a mapping the kernel refuses (EINVAL) stays as it is
    return max(0, before - file_resident_bytes())
