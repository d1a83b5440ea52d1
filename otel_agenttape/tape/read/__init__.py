"""The read model: one definition of a run, a step, a session and a tree, for every store and source.

``Tapes`` (returned by ``otel_agenttape.open``) is the API; ``listing`` holds every SQL string that
reads the ``runs`` view; ``steps``, ``otlp`` and ``summary`` shape what the methods return.
"""

from __future__ import annotations

from ..refs import AmbiguousRunError, RunNotFound
from .summary import Page, RunSummary
from .tapes import Tapes

__all__ = ["AmbiguousRunError", "Page", "RunNotFound", "RunSummary", "Tapes"]
