"""docs/schema.md documents every table column and every view column."""

from __future__ import annotations

import os
import re

from otel_agenttape.store import samples, schema
from otel_agenttape.store.writer import Store

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "schema.md")


def _documented(section: str) -> set[str]:
    text = open(DOC, encoding="utf-8").read()
    body = text.split(f"### `{section}`", 1)[1].split("\n### ", 1)[0]
    first_table = body.split("| column |", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", first_table, flags=re.M))


def test_every_table_and_view_column_is_documented():
    for table in schema.TABLES:
        assert _documented(table) == set(schema.column_names(table)), table
    store = Store(None)
    store.write_traces(samples.genai_requests(n_runs=1))
    reader = store.reader()
    for view in ("runs", "nodes", "steps"):
        assert _documented(view) == set(reader.query(f"SELECT * FROM {view} LIMIT 0").column_names), view
    store.close()
