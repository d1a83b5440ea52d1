"""Where the Iceberg lake tests publish: a SQLite catalog on a folder, or a PostgreSQL catalog (the server
``.ci/postgres.sh`` starts, named by AGENTTAPE_TEST_POSTGRES_URL) with its warehouse in an S3 bucket on
127.0.0.1 (moto in server mode)."""

from __future__ import annotations

import os
from typing import Any

import pytest

PG_ENV = "AGENTTAPE_TEST_POSTGRES_URL"
PG_SKIP = f"{PG_ENV} is not set: run `export {PG_ENV}=$(bash .ci/postgres.sh)`"
KINDS = ["sqlite-folder", "postgresql-s3"]


def new_namespace() -> str:
    """A namespace of its own per lake: the PostgreSQL database outlives the test run."""
    return "t" + os.urandom(5).hex()


def lake_url(kind: str, tmp: Any, moto: str | None = None, bucket: str = "ice") -> str:
    """A fresh Iceberg lake URL of this kind (``moto`` is the S3 endpoint for the PostgreSQL kind)."""
    ns = new_namespace()
    if kind == "sqlite-folder":
        return f"iceberg+sql:///{tmp}/catalog.db#{ns}"
    pg = os.environ.get(PG_ENV)
    if not pg:
        pytest.skip(PG_SKIP)
    assert moto is not None
    rest = pg.split("://", 1)[1]
    return f"iceberg+postgresql://{rest}?warehouse=s3://{bucket}/warehouse#{ns}"


def drop_lake(url: str) -> None:
    """Drop the lake's tables and namespace from its catalog (the data files stay: the test's to clean)."""
    from otel_agenttape.store.lake.iceberg_catalog import TABLES, load

    cat, parsed = load(url)
    for table in TABLES:
        try:
            cat.drop_table(f"{parsed.namespace}.{table}")
        except Exception:  # noqa: BLE001 - a table never created
            pass
    try:
        cat.drop_namespace(parsed.namespace)
    except Exception:  # noqa: BLE001
        pass
    engine = getattr(cat, "engine", None)
    if engine is not None:
        engine.dispose()


def s3_object(url_or_path: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://`` data file path."""
    bucket, _, key = url_or_path[len("s3://"):].partition("/")
    return bucket, key
