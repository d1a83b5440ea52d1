"""The console's Experiments page and one experiment's side-by-side compare, in Debian's headless Chromium
(Playwright, no browser download), against a real `agenttape serve --token` on 127.0.0.1. Two weather runs
are recorded, then re-asked of a fake OpenAI-compatible candidate that changes some answers (one of them
hostile markup) and of one that fails Oslo's calls; screenshots also go to /tmp/console-shots/."""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from pathlib import Path

import httpx
import pytest
from console_app import CHROMIUM, CHROMIUM_ARGS, XSS_TOOL_RESULT, AgenttapeServe, recorder
from experiment_fakes import ChatServer, completion, last_city
from tape_agents import ScriptedModel, ScriptedTools, weather_agent

import otel_agenttape
from otel_agenttape.tape.experiment import Candidate, run_experiment, wait_for_runs

TOKEN = "experiments-console-token"
READY = 'body[data-ready]:not([data-ready=""])'

playwright_api = pytest.importorskip("playwright.sync_api")
if not os.path.exists(CHROMIUM):
    pytest.skip("Debian's chromium is not installed (.ci/run installs it)", allow_module_level=True)


def _tool_call(city: str, n: int) -> dict:
    return {"role": "assistant", "content": "Checking.", "tool_calls": [{
        "id": f"call_{n}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}


def candidate(body, n):
    """Asks for the same tool (Oslo lower-cased), then answers in other words; Oslo's answer is markup."""
    last = body["messages"][-1]
    if last.get("role") == "tool":
        d = json.loads(last["content"])
        text = f"In {d['city']} it is sunny and {d['temp']}F." if d["city"] == "Paris" else XSS_TOOL_RESULT + " cold"
        return 200, completion(body, n, {"role": "assistant", "content": text}, prompt_tokens=40, completion_tokens=10)
    city = last_city(body)
    return 200, completion(body, n, _tool_call(city.lower() if city == "Oslo" else city, n), "tool_calls", 20, 5)


def flaky(body, n):
    if "Oslo" in json.dumps(body["messages"]):
        return 500, {"error": {"message": "overloaded", "type": "server_error"}}
    return candidate(body, n)


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = tmp_path_factory.mktemp("experiment-shots")
    yield folder
    review = Path("/tmp/console-shots")
    review.mkdir(exist_ok=True)
    for png in folder.glob("*.png"):
        shutil.copy(png, review / png.name)


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """The serve, two recorded runs, experiment ``cand`` (3 of 4 answers changed) and ``flaky`` (Oslo's
    two calls failed), every model priced at $1 / $2 per million tokens in / out."""
    folder = tmp_path_factory.mktemp("experiments-console")
    prices = folder / "prices.yaml"
    prices.write_text("fake-1:\n  input_mtok: 1\n  output_mtok: 2\ncand-b:\n  input_mtok: 1\n  output_mtok: 2\n")
    server = AgenttapeServe(folder / "tapes.duckdb", token=TOKEN, env={"AGENTTAPE_PRICES": str(prices)}).start()
    try:
        tape = recorder(server, "weather-app")
        try:
            for city in ("Paris", "Oslo"):
                weather_agent(tape, ScriptedModel(), ScriptedTools(), f"Weather in {city}?", run_id=city.lower())
            tape.force_flush()
        finally:
            tape.shutdown()
        assert server.wait_idle(60)
        exp_tape = recorder(server, "agenttape-experiment")
        try:
            with ChatServer(candidate) as good, ChatServer(flaky) as bad:
                for name, fake in (("cand", good), ("flaky", bad)):
                    run_experiment(otel_agenttape.open(server.url, token=TOKEN), name,
                                   Candidate("cand-b", base_url=fake.base_url), refs=["paris", "oslo"],
                                   journal=folder / f"{name}.sqlite", tape=exp_tape)
            exp_tape.force_flush()
        finally:
            exp_tape.shutdown()
        assert server.wait_idle(60)
        with otel_agenttape.open(server.url, token=TOKEN) as tapes:
            assert wait_for_runs(tapes, "cand", 4) == 4 and wait_for_runs(tapes, "flaky", 4) == 4
            pair = next(p for p in tapes.compare("cand").pairs if "sunny" in (p.candidate.output_text or ""))
        scorer = recorder(server, "reviewer")
        try:
            scorer.score(pair.candidate_ref, "quality", 0.9, source="code")
            scorer.force_flush()
        finally:
            scorer.shutdown()
        assert server.wait_idle(60)
        yield server
    finally:
        server.stop()


def api(server, path: str, **kw) -> httpx.Response:
    return httpx.get(f"{server.url}/api/{path}", headers=server.headers, timeout=120, **kw)


def test_api_lists_experiments_with_their_summaries_and_compares_one(console):
    assert httpx.get(f"{console.url}/api/experiments", timeout=60).status_code == 401
    listed = {e["name"]: e for e in api(console, "experiments").json()["experiments"]}
    assert set(listed) == {"cand", "flaky"}
    s = listed["cand"]["summary"]
    # by hand: Paris's tool call is the same; Paris's answer, Oslo's tool argument and Oslo's answer changed
    assert (s["runs"], s["errors"], s["answer_changed"], s["tool_agreement"]) == (4, 0, 3, 0.75)
    assert (s["baseline_input_tokens"], s["baseline_output_tokens"]) == (2 * (12 + 30), 2 * (3 + 8))
    assert (s["candidate_input_tokens"], s["candidate_output_tokens"]) == (2 * (20 + 40), 2 * (5 + 10))
    assert s["baseline_cost_usd"] == pytest.approx(84e-6 + 2 * 22e-6)
    assert s["candidate_cost_usd"] == pytest.approx(120e-6 + 2 * 30e-6)
    assert listed["flaky"]["summary"]["errors"] == 2 and listed["flaky"]["models"] == ["cand-b"]
    d = api(console, "experiments/cand").json()
    assert d["baseline"] == "original" and len(d["runs"]) == 4
    paris_end = next(p for p in d["runs"] if p["of"].startswith("paris@") and not p["baseline"]["tool_calls"])
    assert paris_end["baseline"]["answer"] == "In Paris it is 57F."
    assert paris_end["candidate"]["answer"] == "In Paris it is sunny and 57F."
    assert paris_end["candidate"]["cost_usd"] == pytest.approx(40e-6 + 20e-6)
    assert paris_end["candidate_scores"]["quality"]["value"] == 0.9
    assert [m["role"] for m in paris_end["baseline"]["input"]][:2] == ["system", "user"]
    assert d["experiment"]["originals"] == 2
    # each original run's nodes in the order they ran: the tool call first, then the answer
    assert [bool(p["baseline"]["tool_calls"]) for p in d["runs"]] == [True, False, True, False]
    assert api(console, "experiments/cand", params={"baseline": "flaky"}).json()["baseline"] == "flaky"
    missing = api(console, "experiments/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["error"]
    assert api(console, "experiments/cand", params={"baseline": "nope"}).status_code == 404
    assert api(console, "experiments/cand", params={"eval": "nobody"}).status_code == 400


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, console):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.errors = []
    pg.requests = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("request", lambda r: pg.requests.append(r.url))
    pg.goto(console.url + "/")
    pg.fill("#token", TOKEN)
    pg.click("#login button[type=submit]")
    pg.wait_for_selector("#runs tbody tr[data-ref]")
    yield pg
    assert pg.errors == []
    assert not [u for u in pg.requests if "xss" in u]
    context.close()


def go(page, url: str, route: str) -> None:
    page.goto(f"{url}/{route}")
    page.wait_for_selector(f'body[data-hash="{route}"]' + READY[4:])
    if page.get_attribute("body", "data-ready") == "error":
        raise AssertionError(f"{route}: {page.inner_text('main')}")


def test_experiments_page_lists_each_experiment_with_its_summary(page, console, shots):
    page.click('header nav a[data-nav="experiments"]')
    page.wait_for_selector('body[data-ready="experiments"]')
    assert page.locator('header nav a[data-nav="experiments"]').get_attribute("class") == "active"
    rows = page.locator("#experiments tbody tr[data-name]")
    assert sorted(rows.evaluate_all("els => els.map(e => e.dataset.name)")) == ["cand", "flaky"]
    cand = page.locator('#experiments tr[data-name="cand"]')
    assert cand.locator('[data-col="changed"]').inner_text().startswith("3")
    assert cand.locator('[data-col="tools"]').inner_text() == "75%"
    assert cand.locator('[data-col="errors"]').inner_text() == "0"
    assert cand.locator('[data-col="cost"]').inner_text().split() == ["$0.0001", "$0.0002"]
    assert cand.locator('[data-col="runs"]').inner_text() == "4 nodes of 2 runs"
    assert "84 / 22\n120 / 30" in cand.inner_text() and "cand-b" in cand.inner_text()
    assert page.locator('#experiments tr[data-name="flaky"] [data-col="errors"]').inner_text() == "2"
    page.screenshot(path=str(shots / "30-experiments.png"), full_page=True)
    page.click('#experiments tr[data-name="cand"] a')
    page.wait_for_selector('body[data-ready="experiment"]')
    assert page.inner_text("#experiment-name") == "cand"


def test_side_by_side_compare_marks_the_answer_diff_as_text(page, console, shots):
    go(page, console.url, "#/experiment/cand")
    pairs = page.locator("#pairs section.pair")
    assert pairs.count() == 4
    assert sorted(pairs.evaluate_all("els => els.map(e => e.dataset.state)")) == ["changed", "changed", "changed", "same"]
    summary = page.inner_text("#experiment-summary")
    assert "3 exactly" in summary and "75%" in summary and "$0.0001 → $0.0002" in summary
    paris = page.locator('#pairs section.pair[data-state="changed"]').filter(has_text="sunny")
    assert paris.locator("ins.d-ins").all_inner_texts() == ["sunny and "]
    assert paris.locator("del.d-del").count() == 0
    assert paris.locator(".side").nth(1).locator('[data-score="quality"]').inner_text() == "quality 0.9"
    assert "tokens 40 / 10" in paris.locator(".side").nth(1).inner_text()
    assert "tokens 30 / 8" in paris.locator(".side").nth(0).inner_text()
    # Oslo's first node: the tool argument changed, said in the pair's head
    oslo_tool = page.locator('#pairs section.pair[data-of^="oslo@"]').filter(has=page.locator('[data-tools="disagree"]'))
    assert oslo_tool.count() == 1 and '"oslo"' in oslo_tool.locator(".side").nth(1).inner_text()
    assert oslo_tool.locator(".side").nth(0).locator(".call-diff").count() == 1  # "Oslo": not asked by the candidate
    assert oslo_tool.locator(".side").nth(1).locator(".call-diff").count() == 1
    assert page.locator("#pairs section.pair.is-same .call-diff").count() == 0
    # hostile markup in a candidate's answer is characters on the page, never an element
    hostile = page.locator("#pairs ins.d-ins").filter(has_text="onerror")
    assert hostile.count() == 1 and "<img src=" in hostile.inner_text()
    assert page.locator("#pairs img").count() == 0 and page.evaluate("window.__xss") is None
    page.screenshot(path=str(shots / "31-experiment-compare.png"), full_page=True)
    go(page, console.url, "#/experiment/cand?only=changed")
    assert page.locator("#pairs section.pair").count() == 3
    go(page, console.url, "#/experiment/flaky?only=errors")
    errs = page.locator("#pairs section.pair")
    assert errs.count() == 2 and all("overloaded" in t for t in errs.locator(".side p.error").all_inner_texts())
    assert page.locator("#pairs del.d-del").count() == 0  # a failed call is no change of answer
    page.screenshot(path=str(shots / "32-experiment-errors.png"), full_page=True)
    page.goto(f"{console.url}/#/experiment/" + urllib.parse.quote("nope"))
    page.wait_for_selector('body[data-ready="error"]')
    assert "no experiment named 'nope'" in page.inner_text("main")
