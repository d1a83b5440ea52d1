"""Read-only SQL: writes, ATTACH, INSTALL/LOAD, COPY, SET, PRAGMA and file/network access are refused."""

from __future__ import annotations

import pytest

from otel_agenttape.store import samples
from otel_agenttape.store.reader import QueryError, open_reader
from otel_agenttape.store.sql import check_readonly, run_readonly_sql
from otel_agenttape.store.writer import Store

REFUSED = [
    "INSERT INTO spans SELECT * FROM spans",
    "DELETE FROM spans",
    "UPDATE spans SET name = 'x'",
    "DROP TABLE spans",
    "CREATE TABLE x AS SELECT 1",
    "ATTACH '/tmp/other.duckdb' AS o",
    "INSTALL httpfs",
    "LOAD httpfs",
    "COPY spans TO '/tmp/out.csv'",
    "SET enable_external_access = true",
    "PRAGMA enable_profiling",
    "SELECT 1; DROP TABLE spans",
    "CALL duckdb_settings()",
    "EXPORT DATABASE '/tmp/x'",
    "",
]

FILE_ACCESS = [
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_blob('/etc/hostname')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT * FROM read_parquet('{other}')",
    "SELECT * FROM read_json_auto('https://example.com/x.json')",
    "SELECT * FROM glob('/etc/*')",
]


@pytest.fixture(scope="module", params=["file", "lake", "memory"])
def reader(request, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp(request.param)
    reqs = samples.genai_requests(n_runs=2)
    if request.param == "memory":
        store = Store(None)
        store.write_traces(reqs)
        r = store.reader()
        yield r
        r.close()
        store.close()
        return
    db = str(tmp_path / "s.duckdb")
    with Store(db) as store:
        store.write_traces(reqs)
        if request.param == "lake":
            from otel_agenttape.store.parquet import export_parquet

            export_parquet(store.reader(), str(tmp_path / "lake"))
    r = open_reader(db if request.param == "file" else str(tmp_path / "lake"))
    yield r
    r.close()


@pytest.mark.parametrize("sql", REFUSED)
def test_statement_check_refuses(sql):
    with pytest.raises(QueryError):
        check_readonly(sql)


def test_selects_run(reader):
    out = run_readonly_sql(reader, "SELECT count(*) AS n FROM spans WHERE run_id = ?", ["run-7-0"])
    assert out.column("n").to_pylist() == [4]
    assert run_readonly_sql(reader, "WITH x AS (SELECT 1 AS a) SELECT a FROM x").num_rows == 1


@pytest.mark.parametrize("sql", REFUSED[:-1])
def test_refused_on_every_reader(reader, sql):
    with pytest.raises(QueryError):
        run_readonly_sql(reader, sql)
    assert run_readonly_sql(reader, "SELECT count(*) FROM spans").column(0)[0].as_py() == 8


@pytest.mark.parametrize("sql", FILE_ACCESS)
def test_file_and_network_access_fail_in_the_engine(reader, sql, tmp_path):
    other = tmp_path / "other.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"secret": [1]}), other)
    with pytest.raises(QueryError) as err:
        run_readonly_sql(reader, sql.format(other=other))
    assert "/etc/passwd" not in str(err.value) or "disabled" in str(err.value).lower() or "permission" in str(
        err.value).lower() or "does not exist" in str(err.value)


def test_engine_refuses_even_if_the_statement_check_is_skipped(reader):
    # the second guard alone: call the reader directly with a SELECT that reads a file
    with pytest.raises(QueryError, match="(?i)permission|disabled"):
        reader.query("SELECT * FROM read_text('/etc/passwd')")
