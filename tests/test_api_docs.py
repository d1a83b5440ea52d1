"""The read API examples in docs/api.md (blocks after ``<!-- api-read-example -->``) run as written."""

from __future__ import annotations

import contextlib
import io
import os
import re

from otel_agenttape.demo import run_demo

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "api.md")
MARK = "<!-- api-read-example -->"


def _blocks() -> list[str]:
    text = open(DOC, encoding="utf-8").read()
    return [m.group(1) for m in re.finditer(re.escape(MARK) + r"\s*```python\n(.*?)```", text, flags=re.S)]


def test_read_api_examples_run_against_the_demo(tmp_path, monkeypatch):
    blocks = _blocks()
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    run_demo("agenttape.duckdb")
    scope: dict[str, object] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, DOC, "exec"), scope)  # noqa: S102 - the documentation's own examples
    printed = out.getvalue()
    # the outputs the comments in the examples promise
    assert "3 ['critic', 'researcher']" in printed
    assert "coordinator agenttape completed demo-session" in printed
    assert "['fetch_page', 'web_search'] 1 True" in printed
    assert "input terminal completed" in printed and "['critic', 'researcher']" in printed
    assert "[(True, True)]" in printed and "[{'n': 3}]" in printed
    assert "True researcher 3" in printed
    assert (tmp_path / "train.jsonl").exists()
