"""The README's example runs as printed (against a real receiver) and its commands exist."""

import re
import subprocess
import sys
from pathlib import Path

import duckdb

from otel_agenttape.receiver.server import TapeServer

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_opens_with_the_two_commands_ci_runs():
    first, second = _blocks("bash")[:2]
    assert "agenttape demo" in first
    ci = (README.parent / ".ci" / "run").read_text()
    assert second.strip() in ci


def test_readme_example_records_what_it_says(tmp_path):
    code = _blocks("python")[0]
    server = TapeServer(str(tmp_path / "readme.duckdb"), http_port=0, grpc_port=0)
    server.start()
    try:
        code = code.replace("http://127.0.0.1:4318", f"http://127.0.0.1:{server.http_port}")
        script = tmp_path / "example.py"
        script.write_text(code)
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert server.wait_idle(30)
        runs = server.query("SELECT agent, status, model_nodes, tool_nodes FROM runs ORDER BY agent").to_pylist()
    finally:
        server.stop()
    assert runs == [
        {"agent": "booker", "status": "completed", "model_nodes": 0, "tool_nodes": 1},
        {"agent": "planner", "status": "completed", "model_nodes": 1, "tool_nodes": 1},
    ]
    con = duckdb.connect(str(tmp_path / "readme.duckdb"), read_only=True)
    names = sorted(r[0] for r in con.execute("SELECT name FROM spans WHERE node_type IS NOT NULL").fetchall())
    con.close()
    assert names == ["chat gpt-4o", "execute_tool book_table", "execute_tool weather",
                     "invoke_agent booker", "invoke_agent planner"]


def test_every_command_in_the_cli_table_exists():
    table = README.read_text().split("## Command line", 1)[1].split("##", 1)[0]
    commands = set(re.findall(r"`agenttape ([a-z-]+)", table)) | set(re.findall(r", `?([a-z-]+)(?: [A-Z_]+)*`", table))
    help_text = subprocess.run([sys.executable, "-m", "otel_agenttape", "--help"], capture_output=True,
                               text=True).stdout
    for command in commands:
        assert re.search(rf"^\s+{re.escape(command)}\b", help_text, flags=re.M), command
