"""Cost at read time: OpenAI and Anthropic usage with cached tokens priced as genai-prices' table says
(expected dollars computed by hand in cost_support), an unknown model unknown and counted, overrides."""

from __future__ import annotations

import json
import socket

import pytest

import otel_agenttape
from cost_support import ANTHROPIC_USD, LOCAL_MODEL, OPENAI_USD, record
from otel_agenttape.cli import main
from otel_agenttape.pricing import Prices, PricesFileError


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return record(tmp_path_factory.mktemp("cost"))


def test_prices_by_hand_and_never_the_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("pricing opened a socket")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    from genai_prices import data_snapshot
    p = Prices()
    assert p.call_usd("openai", "gpt-4o", 1000, 500, 200, None) == pytest.approx(OPENAI_USD)
    assert p.call_usd("anthropic", "claude-3-5-sonnet-20241022", 1000, 500, 200, 100) == pytest.approx(ANTHROPIC_USD)
    # a snapshot set by genai-prices' auto-update is never used
    monkeypatch.setattr(data_snapshot, "_custom_snapshot", data_snapshot.DataSnapshot(providers=[], from_auto_update=True))
    assert Prices().call_usd("openai", "gpt-4o", 1000, 500, 200, None) == pytest.approx(OPENAI_USD)
    assert p.call_usd("vllm", LOCAL_MODEL, 10, 5) is None
    assert p.call_usd("openai", "gpt-4o", None, None) is None


def test_runs_tree_session_and_unknown(db):
    with otel_agenttape.open(db) as t:
        runs = {r.agent: r for r in t.runs().runs}
        assert runs["planner"].cost_usd == pytest.approx(OPENAI_USD + ANTHROPIC_USD)
        assert runs["helper"].cost_usd == pytest.approx(OPENAI_USD) and runs["helper"].unpriced_calls == 1
        assert runs["second"].cost_usd is None and runs["second"].unpriced_calls == 1
        tree = t.cost("run-planner", tree=True)
        assert tree["usd"] == pytest.approx(2 * OPENAI_USD + ANTHROPIC_USD) and tree["unpriced_calls"] == 1
        doc = t.replay("run-helper")
        assert [c["usd"] for c in doc["cost"]["calls"]] == [None, pytest.approx(OPENAI_USD)]
        assert t.cost(session="s1")["unpriced_calls"] == 2


def test_overrides_and_cli(db, tmp_path, capsys, monkeypatch):
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"{LOCAL_MODEL}:\n  input_mtok: 0.5\n  output_mtok: 1.5\n")
    assert main(["runs", "--db", db, "--json", "--prices", str(prices)]) == 0
    rows = {r["agent"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["second"]["cost_usd"] == pytest.approx((10 * 0.5 + 5 * 1.5) / 1e6)
    assert rows["helper"]["cost_usd"] == pytest.approx(OPENAI_USD + (2000 * 0.5 + 1000 * 1.5) / 1e6)
    assert main(["runs", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "unknown" in out and "2 model calls without a price" in out
    monkeypatch.setenv("AGENTTAPE_PRICES", str(prices))
    assert main(["replay", "run-second", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cost"]["unpriced_calls"] == 0
    bad = tmp_path / "bad.json"
    bad.write_text('{"m": {"input_mtok": -1, "output_mtok": 1}}')
    with pytest.raises(PricesFileError, match="negative"):
        Prices.load(bad)
    assert main(["show", "run-second", "--db", db, "--prices", str(bad)]) == 2
