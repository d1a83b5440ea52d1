""".ci/postgres.sh: starts a real PostgreSQL on 127.0.0.1, prints a working URL, is idempotent, stops."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "postgres.sh"

pytestmark = pytest.mark.skipif(
    not glob.glob("/usr/lib/postgresql/*/bin/initdb") or (os.geteuid() != 0 and not shutil.which("initdb")),
    reason="PostgreSQL server binaries are not installed (bash .ci/postgres.sh installs them as root)",
)


def test_script_starts_reuses_and_stops_a_server(tmp_path_factory) -> None:
    import sqlalchemy as sa

    pg_dir = Path("/tmp") / f"agenttape-pg-test-{os.getpid()}"  # readable by the postgres account
    env = {**os.environ, "AGENTTAPE_PG_DIR": str(pg_dir)}
    try:
        first = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        url = first.stdout.strip()
        assert url.startswith("postgresql+psycopg://agenttape:") and "@127.0.0.1:" in url
        assert (pg_dir / "url").read_text().strip() == url
        assert oct((pg_dir / "url").stat().st_mode & 0o777) == "0o600"

        again = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == url and "reusing" in again.stderr

        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("select current_user, current_database()")).one() == (
                "agenttape",
                "agenttape_test",
            )
        engine.dispose()
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(pg_dir, ignore_errors=True)
