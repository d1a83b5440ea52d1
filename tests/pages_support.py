"""Paging through every runs page of a source, as a user of ``Tapes.runs`` would."""

from __future__ import annotations

from typing import Any

import otel_agenttape


def all_pages(source: Any, limit: int) -> tuple[list[str], list[int]]:
    """Every ref of every page and each page's total, paging from a fresh reader until no cursor is left."""
    refs: list[str] = []
    totals: list[int] = []
    with otel_agenttape.open(source) as tapes:
        cursor = None
        while True:
            page = tapes.runs(limit=limit, cursor=cursor)
            refs += [r.ref for r in page.runs]
            totals.append(page.total)
            cursor = page.next_cursor
            if cursor is None:
                return refs, totals
