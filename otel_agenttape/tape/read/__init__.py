"""The read model: one definition of a run, a step, a session and a tree, for every store and source.

``Tapes`` (returned by ``otel_agenttape.open``) is the API. ``listing`` answers runs pages and lists:
``filters`` turns what ``runs()`` selects into SQL, ``run_rows`` computes ``runs`` rows from some traces'
spans, ``kept`` keeps a store version's keys and summaries between pages, ``index_keys`` reads keys from
a run index. ``steps``, ``otlp`` and ``summary`` shape what the methods return.
"""

from __future__ import annotations

from ..refs import AmbiguousRunError, RunNotFound
from .summary import Page, RunSummary
from .tapes import Tapes

__all__ = ["AmbiguousRunError", "Page", "RunNotFound", "RunSummary", "Tapes"]
