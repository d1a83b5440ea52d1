"""pytest plugin: turn a recorded run into a regression test.

    @pytest.mark.agenttape_cassette("run-id", db="tapes.duckdb")
    def test_agent(agenttape_cassette):
        out = my_agent(model=agenttape_cassette.model, tools=agenttape_cassette.tools)
        assert out == agenttape_cassette.output

The store is the marker's ``db`` (a DuckDB file or a Parquet lake folder), else ``--agenttape-db``,
else ``$AGENTTAPE_DB``, else ``./agenttape.duckdb``. With ``strict=True`` (the default) a test
that passes without replaying every recorded call fails: the program took a shorter path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from .cassette import Cassette

MARKER = "agenttape_cassette"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agenttape")
    group.addoption(
        "--agenttape-db",
        dest="agenttape_db",
        default=None,
        help="tape store (DuckDB file or Parquet lake) for @pytest.mark.agenttape_cassette tests",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(run_id, db=None, tree=False, strict=True, check_requests=True): replay a recorded "
        "agenttape run (tree: with its child runs) as a cassette (fixture `agenttape_cassette`)",
    )


def _store(request: pytest.FixtureRequest, marker: Any) -> str:
    db = marker.kwargs.get("db")
    if callable(db):
        db = db()
    return str(
        db
        or request.config.getoption("agenttape_db", default=None)
        or os.environ.get("AGENTTAPE_DB")
        or "./agenttape.duckdb"
    )


@pytest.fixture
def agenttape_cassette(request: pytest.FixtureRequest) -> Iterator[Cassette]:
    """The cassette named by the test's ``agenttape_cassette`` marker."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        raise pytest.UsageError(f"the agenttape_cassette fixture needs @pytest.mark.{MARKER}('run-id')")
    run_id = marker.args[0] if marker.args else marker.kwargs.get("run_id")
    if not run_id:
        raise pytest.UsageError(f"@pytest.mark.{MARKER} needs a run id")
    cassette = Cassette.from_store(
        _store(request, marker), str(run_id), tree=bool(marker.kwargs.get("tree", False)),
        check_requests=marker.kwargs.get("check_requests", True),
    )
    failed_before = request.session.testsfailed
    yield cassette
    if marker.kwargs.get("strict", True) and request.session.testsfailed == failed_before:
        cassette.assert_consumed()
