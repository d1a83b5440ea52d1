"""Compiled fast paths, when the build made them: each one has a pure-Python twin that stays the reference.

``AGENTTAPE_NO_NATIVE=1`` (read once, at import) turns every compiled path off, so the Python paths
can be run and compared on a machine where the compiled ones are built.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

DISABLED = os.environ.get("AGENTTAPE_NO_NATIVE", "").strip() not in ("", "0")

# every compiled module, and what it speeds up
MODULES = {
    "otel_agenttape.integrity._leaf": "canonical leaf of a span (sealing)",
    "otel_agenttape.integrity._chain": "chain link and Merkle update (sealing)",
    "otel_agenttape.capture._sealing": "the sealing processor's common step",
    "otel_agenttape.store._spanwalk": "OTLP span conversion in the receiver",
    "otel_agenttape.receiver._wirecount": "counting a request's spans before decoding it",
    "otel_agenttape.tape._sealed_entries": "leaf hashes of stored rows (verify)",
    "otel_agenttape.codec._otlp_encode": "OTLP span encoding in the exporters",
}


def load(name: str) -> ModuleType | None:
    """The compiled module ``name``, or None when it is not built (or compiled paths are turned off)."""
    if DISABLED:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def status() -> dict[str, str]:
    """For each compiled module: "compiled", "turned off" or "not built" (``agenttape doctor`` shows it)."""
    out = {}
    for name in MODULES:
        if DISABLED:
            out[name] = "turned off (AGENTTAPE_NO_NATIVE)"
        else:
            out[name] = "compiled" if load(name) is not None else "not built"
    return out
