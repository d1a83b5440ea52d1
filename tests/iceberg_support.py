"""Where the Iceberg lake tests publish: a SQLite catalog on a folder, a PostgreSQL catalog (the server
``.ci/postgres.sh`` starts, named by AGENTTAPE_TEST_POSTGRES_URL) with its warehouse in an S3 bucket on
127.0.0.1 (moto in server mode), or an Iceberg REST catalog on 127.0.0.1 (``iceberg_rest_server.py``, a
process of its own) with its warehouse on a folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

PG_ENV = "AGENTTAPE_TEST_POSTGRES_URL"
PG_SKIP = f"{PG_ENV} is not set: run `export {PG_ENV}=$(bash .ci/postgres.sh)`"
# every catalog on a folder and on S3 (moto); the REST catalog server keeps its warehouse in a folder
KINDS = ["sqlite-folder", "sqlite-s3", "postgresql-folder", "postgresql-s3", "rest-folder"]
HERE = os.path.dirname(os.path.abspath(__file__))


class RestCatalogServer:
    """``iceberg_rest_server.py`` in its own process: a REST catalog at ``self.address`` (host:port)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self, timeout: float = 30.0) -> RestCatalogServer:
        os.makedirs(self.folder, exist_ok=True)
        port_file = os.path.join(self.folder, "port")
        log = open(os.path.join(self.folder, "server.log"), "wb")  # noqa: SIM115 - kept open for the process
        self.proc = subprocess.Popen(  # noqa: S603 - our own test server
            [sys.executable, os.path.join(HERE, "iceberg_rest_server.py"), "--catalog",
             os.path.join(self.folder, "catalog.db"), "--warehouse", os.path.join(self.folder, "warehouse"),
             "--port-file", port_file], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the REST catalog server did not start: {self.log()}")
            time.sleep(0.05)
        with open(port_file) as fh:
            self.address = f"127.0.0.1:{fh.read().strip()}"
        got = httpx.get(f"http://{self.address}/v1/config", timeout=10)
        assert got.status_code == 200 and "endpoints" in got.json(), got.text
        return self

    def log(self) -> str:
        with open(os.path.join(self.folder, "server.log"), "rb") as fh:
            return fh.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def rest_catalog(tmp_path_factory: Any) -> Iterator[RestCatalogServer]:
    """One REST catalog server per test module (each lake has a namespace of its own in it)."""
    server = RestCatalogServer(str(tmp_path_factory.mktemp("rest-catalog"))).start()
    yield server
    server.stop()


def new_namespace() -> str:
    """A namespace of its own per lake: the PostgreSQL database outlives the test run."""
    return "t" + os.urandom(5).hex()


def lake_url(kind: str, tmp: Any, moto: str | None = None, bucket: str = "ice", rest: str | None = None) -> str:
    """A fresh Iceberg lake URL of this kind (``moto`` is the S3 endpoint for the PostgreSQL kind, ``rest``
    the REST catalog server's host:port for the REST kind)."""
    ns = new_namespace()
    if kind == "sqlite-folder":
        return f"iceberg+sql:///{tmp}/catalog.db#{ns}"
    if kind == "rest-folder":
        assert rest is not None
        return f"iceberg+rest://{rest}#{ns}"
    if kind.endswith("-s3"):
        assert moto is not None
        warehouse = f"s3://{bucket}/warehouse"
    else:
        warehouse = f"{tmp}/warehouse"
    if kind.startswith("sqlite"):
        return f"iceberg+sql:///{tmp}/catalog.db?warehouse={warehouse}#{ns}"
    pg = os.environ.get(PG_ENV)
    if not pg:
        pytest.skip(PG_SKIP)
    return f"iceberg+postgresql://{pg.split('://', 1)[1]}?warehouse={warehouse}#{ns}"


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
