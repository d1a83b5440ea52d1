"""The console's page in Debian's headless Chromium (Playwright, no browser download), against a real
`agenttape serve` process on 127.0.0.1 (its token required) fed by the demo, another vendor's instrumentation, a 50-child fleet, nested
children and hostile content; screenshots go to a temp folder (and /tmp/console-shots/ for review)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import duckdb
import httpx
import pytest

from console_app import (
    CHROMIUM,
    AgenttapeServe,
    CHROMIUM_ARGS,
    FLEET_CHILDREN,
    XSS_SCRIPT,
    XSS_TOOL_RESULT,
    PRICED_OPENAI_USD,
    record_fleet,
    record_hostile,
    record_nested,
    record_priced,
    recorder,
)

def get(url: str, **kwargs) -> httpx.Response:
    """A GET with room for a loaded machine (the default 5 s is short for a store scan under load)."""
    return httpx.get(url, timeout=120, **kwargs)


HERE = Path(__file__).resolve().parent
TOKEN = "console-test-token"
ANNOTATE = "console-annotate-token"
READY = 'body[data-ready]:not([data-ready=""])'

playwright_api = pytest.importorskip("playwright.sync_api")
if not os.path.exists(CHROMIUM):
    pytest.skip("Debian's chromium is not installed (.ci/run installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = tmp_path_factory.mktemp("console-shots")
    yield folder
    review = Path("/tmp/console-shots")
    review.mkdir(exist_ok=True)
    for png in folder.glob("*.png"):
        shutil.copy(png, review / png.name)


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """`agenttape serve --token` on free loopback ports, fed over OTLP by the demo, another vendor's
    instrumentation (its own process), a fleet, a nested tree and a hostile run; the page is its console."""
    from otel_agenttape.demo import run_demo_agents
    from tape_fakeopenai import FakeOpenAI

    folder = tmp_path_factory.mktemp("console")
    server = AgenttapeServe(folder / "tapes.duckdb", token=TOKEN, annotate_token=ANNOTATE).start()
    try:
        tape = recorder(server, "agenttape-demo")
        try:
            demo = run_demo_agents(tape)
        finally:
            tape.shutdown()
        env = server.export_env()
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
        with FakeOpenAI() as fake:
            proc = subprocess.run([sys.executable, str(HERE / "tape_foreign_app.py"), "openinference", server.url,
                                   fake.base_url], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        foreign_trace = proc.stdout.strip().splitlines()[-1]
        ids = {"demo": demo, "foreign": foreign_trace, "fleet": record_fleet(server),
               "nested": record_nested(server), "priced": record_priced(server),
               "hostile": record_hostile(server)}
        assert server.wait_idle(60), Path(server.log).read_text()[-3000:]
        yield server.url, ids, server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, console):
    url = console[0]
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(url + "/")
    pg.fill("#token", TOKEN)
    pg.click("#login button[type=submit]")
    pg.wait_for_selector("#runs tbody tr[data-ref]")
    yield pg
    assert pg.errors == []
    context.close()


def go(page, url: str, route: str) -> None:
    """Open a route and wait until its view has rendered (or failed: then say why)."""
    page.goto(f"{url}/{route}")
    page.wait_for_selector(f'body[data-hash="{route}"]' + READY[4:])
    if page.get_attribute("body", "data-ready") == "error":
        raise AssertionError(f"{route}: {page.inner_text('main')}")


def ref_of(page, agent: str) -> str:
    """The ref of the newest run of ``agent``, found through the list's agent filter."""
    url = page.url.split("#")[0].rstrip("/")
    go(page, url, "#/?agent=" + urllib.parse.quote(agent))
    page.wait_for_selector("#runs tbody tr[data-ref]")
    return page.locator("#runs tbody tr[data-ref]").first.get_attribute("data-ref")


def load_all(page) -> None:
    while page.locator("#more").is_visible():
        n = page.locator("#runs tbody tr[data-ref]").count()
        page.click("#more")
        for _ in range(200):
            if page.locator("#runs tbody tr[data-ref]").count() > n:
                break
            page.wait_for_timeout(25)


def test_runs_list_shows_our_runs_and_foreign_ones(page, console, shots):
    url, ids, _ = console
    page.screenshot(path=str(shots / "01-runs.png"))
    assert page.locator("#runs tbody tr[data-ref]").count() == 50  # one page
    load_all(page)
    agents = page.locator("#runs td.agent a").all_inner_texts()
    for name in ("coordinator", "researcher", "critic", "fleet", "level-0", "level-3", "surveyor-49"):
        assert name in agents
    rows = page.locator("#runs tbody tr[data-ref]")
    refs = [rows.nth(i).get_attribute("data-ref") for i in range(rows.count())]
    # the foreign trace (no agenttape.* attributes) is a run like ours, named by its service
    foreign = [r for r in refs if r.endswith("@" + ids["foreign"])]
    assert foreign, refs
    assert "foreign-openinference" in agents
    total = page.inner_text("#runs-total")
    assert re.match(r"\d+ runs", total) and int(total.split()[0]) >= 3 + 1 + 51 + 5 + 1
    # newest first: the hostile run was recorded last
    assert rows.first.locator("td.agent").inner_text().startswith("<b onmouseover")
    # a filter narrows the list, through the URL
    go(page, url, "#/?agent=researcher")
    page.wait_for_selector("#runs tbody tr[data-ref]")
    assert page.locator("#runs td.agent a").all_inner_texts() == ["researcher"]
    assert page.inner_text("#runs-total").startswith("1 run")
    # free text over content finds a run by what its tool returned
    go(page, url, "#/?text=" + urllib.parse.quote("population"))
    page.wait_for_selector("#runs tbody tr[data-ref]")
    assert set(page.locator("#runs td.agent a").all_inner_texts()) <= {f"surveyor-{i:02d}" for i in range(50)}
    page.screenshot(path=str(shots / "02-runs-filtered.png"))


def test_a_run_shows_its_steps_and_node_io(page, console, shots):
    url, ids, _ = console
    ref = ref_of(page, "researcher")
    go(page, url, f"#/run/{urllib.parse.quote(ref)}")
    page.wait_for_selector("#steps li.step")
    kinds = page.locator("#steps li.step").evaluate_all("els => els.map(e => e.dataset.kind)")
    assert kinds[0] == "input" and kinds[-1] == "terminal"
    assert {"text", "reasoning", "tool_call", "tool_result"} <= set(kinds)
    body = page.inner_text("#steps")
    assert "Collect facts about OpenTelemetry for agents." in body
    assert "could not reach https://example.invalid/otel" in body  # the failing tool's error
    assert "OpenTelemetry GenAI semantic conventions" in body  # a tool call's arguments
    page.screenshot(path=str(shots / "03-run-steps.png"), full_page=True)
    go(page, url, f"#/run/{urllib.parse.quote(ref)}?tab=nodes")
    page.wait_for_selector("#nodes section.node")
    assert page.locator("#nodes section.node-model").count() == 2
    assert page.locator("#nodes section.node-tool").count() == 3
    nodes = page.inner_text("#nodes")
    assert "You are the researcher. Be brief." in nodes  # the model node's full input, as chat
    assert "Findings: the GenAI conventions" in nodes  # its output
    page.screenshot(path=str(shots / "04-run-nodes.png"), full_page=True)
    go(page, url, f"#/run/{urllib.parse.quote(ref)}?tab=timeline")
    page.wait_for_selector("#waterfall .wf-row[data-span]")
    assert page.locator("#waterfall .wf-row[data-span]").count() == 1 + 2 + 3
    page.screenshot(path=str(shots / "05-run-timeline.png"))


def test_a_foreign_run_shows_its_io(page, console, shots):
    url, ids, _ = console
    ref = ref_of(page, "foreign-openinference")
    go(page, url, f"#/run/{urllib.parse.quote(ref)}?tab=nodes")
    page.wait_for_selector("#nodes section.node")
    text = page.inner_text("#nodes")
    assert "Weather in Paris?" in text and "It is 57F in Paris." in text
    page.screenshot(path=str(shots / "06-foreign-run.png"), full_page=True)


def test_the_demo_tree_renders_one_node_per_child_and_a_click_opens_it(page, console, shots):
    url, ids, _ = console
    ref = ref_of(page, "coordinator")
    go(page, url, f"#/tree/{urllib.parse.quote(ref)}")
    nodes = page.locator("#graph g.gnode")
    assert nodes.count() == 3
    texts = nodes.all_text_contents()
    assert any("researcher" in t and "web_search ×2" in t for t in texts)
    page.screenshot(path=str(shots / "07-demo-tree.png"))
    child = page.locator("#graph g.gnode", has_text="critic")
    child_ref = child.get_attribute("data-ref")
    child.click()
    page.wait_for_url(re.compile(r"#/run/"))
    page.wait_for_selector(READY)
    assert page.inner_text("main h1") == "critic"
    assert urllib.parse.unquote(page.url.split("#/run/")[1]) == child_ref
    assert child_ref.split("@")[0] == ids["demo"]["children"]["critic"]


def test_a_fleet_of_fifty_and_deep_nesting_stay_readable(page, console, shots):
    url, ids, _ = console
    ref = ref_of(page, "fleet")
    go(page, url, f"#/tree/{urllib.parse.quote(ref)}")
    nodes = page.locator("#graph g.gnode")
    assert nodes.count() == 1 + FLEET_CHILDREN
    boxes = [nodes.nth(i).bounding_box() for i in range(nodes.count())]
    # fitted into the view: every node is on screen, none overlaps another
    view = page.locator("#graph").bounding_box()
    for b in boxes:
        assert view["x"] <= b["x"] and b["x"] + b["width"] <= view["x"] + view["width"] + 1
        assert view["y"] <= b["y"] and b["y"] + b["height"] <= view["y"] + view["height"] + 1
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                    or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])
    assert min(b["width"] for b in boxes) > 100  # still legible at the fitted zoom
    page.screenshot(path=str(shots / "08-fleet-tree.png"))
    # zoom and pan change the scene's transform
    before = page.get_attribute("#graph g.scene", "transform")
    page.click("#zoom-in")
    zoomed = page.get_attribute("#graph g.scene", "transform")
    assert zoomed != before
    page.mouse.move(view["x"] + 30, view["y"] + view["height"] - 20)
    page.mouse.down()
    page.mouse.move(view["x"] + 230, view["y"] + view["height"] - 120, steps=5)
    page.mouse.up()
    assert page.get_attribute("#graph g.scene", "transform") != zoomed
    go(page, url, "#/")
    page.wait_for_selector("#runs tbody tr[data-ref]")
    ref = ref_of(page, "level-0")
    go(page, url, f"#/tree/{urllib.parse.quote(ref)}")
    assert sorted(page.locator("#graph g.gnode text.g-agent").all_text_contents()) == [
        "level-0", "level-1", "level-2", "level-3", "sibling"]
    ys = {t: page.locator("#graph g.gnode", has_text=t).bounding_box()["y"] for t in ("level-0", "level-1", "level-2", "level-3")}
    assert ys["level-0"] < ys["level-1"] < ys["level-2"] < ys["level-3"]
    page.screenshot(path=str(shots / "09-nested-tree.png"))


def test_session_and_diff_pages(page, console, shots):
    url, ids, _ = console
    go(page, url, "#/session/demo-session")
    page.wait_for_selector("#turns li.turn")
    assert page.locator("#turns li.turn").count() == 3
    assert "Should our team adopt OpenTelemetry" in page.inner_text("#turns")
    page.screenshot(path=str(shots / "10-session.png"), full_page=True)
    go(page, url, "#/")
    page.wait_for_selector("#runs tbody tr[data-ref]")
    a, b = ref_of(page, "surveyor-01"), ref_of(page, "surveyor-02")
    go(page, url, f"#/diff/{urllib.parse.quote(a)}/{urllib.parse.quote(b)}")
    page.wait_for_selector("#diff tr.diverge")
    assert "diverge at node 0" in page.inner_text("#diff-verdict")
    row = page.inner_text("#diff tr.diverge")
    assert '"city": 1' in row and '"city": 2' in row
    page.screenshot(path=str(shots / "11-diff.png"), full_page=True)


def _usd(n: float) -> str:
    return f"${n:.4f}"


def test_cost_in_the_list_run_page_tree_and_session(page, console, shots):
    """Dollars from genai-prices in the runs column, the run page, its nodes, the tree's total and the
    session's; a call without a price makes a cost unknown (never $0) and says so."""
    url, ids, _ = console
    go(page, url, "#/?session=cost-session")
    page.wait_for_selector("#runs tbody tr[data-ref]")
    header = page.locator("#runs thead th").all_text_contents()
    col = header.index("cost")
    cells = {r.locator("td.agent a").inner_text(): r.locator("td").nth(col) for r in page.locator("#runs tbody tr[data-ref]").all()}
    assert set(cells) == {"buyer", "pricer", "buyer-2"}, list(cells)
    assert cells["buyer"].inner_text() == _usd(PRICED_OPENAI_USD)
    assert cells["pricer"].inner_text() == _usd(PRICED_OPENAI_USD) + " +1?"
    assert "without a price" in cells["pricer"].get_attribute("title")
    assert cells["buyer-2"].inner_text() == "unknown"
    page.screenshot(path=str(shots / "17-cost-runs.png"))
    ref = page.locator("#runs tbody tr[data-ref]", has_text="pricer").get_attribute("data-ref")
    go(page, url, f"#/run/{urllib.parse.quote(ref)}?tab=nodes")
    page.wait_for_selector("#nodes .node-cost")
    assert page.inner_text("#run-cost").startswith(_usd(PRICED_OPENAI_USD) + " +1? (1 call without a price)")
    assert sorted(page.locator("#nodes .node-cost").all_text_contents()) == ["cost " + _usd(PRICED_OPENAI_USD), "cost unknown"]
    page.screenshot(path=str(shots / "18-cost-run-nodes.png"), full_page=True)
    go(page, url, "#/?agent=buyer")  # the tree of the first turn: both runs, each run's calls once
    page.wait_for_selector("#runs tbody tr[data-ref]")
    root = page.locator("#runs tbody tr[data-ref]").first.get_attribute("data-ref")
    assert root.split("@")[0] == ids["priced"]
    go(page, url, f"#/tree/{urllib.parse.quote(root)}")
    page.wait_for_selector("#graph g.gnode")
    assert f"cost {_usd(2 * PRICED_OPENAI_USD)} +1?" in page.inner_text("main")
    page.screenshot(path=str(shots / "19-cost-tree.png"))
    go(page, url, "#/session/cost-session")
    page.wait_for_selector("#turns li.turn")
    assert page.inner_text("#session-cost") == f"cost {_usd(2 * PRICED_OPENAI_USD)} +2?"
    page.screenshot(path=str(shots / "20-cost-session.png"), full_page=True)


def test_annotating_needs_its_own_token_and_shows_at_once(page, console, shots):
    """A person scores a run and one of its nodes from the run page: refused without the annotate token
    (the read token is not enough), then recorded through the receiver and listed at once, its comment
    as text; the runs list shows the score and filters by it."""
    url, ids, _ = console
    go(page, url, "#/?agent=buyer")
    page.wait_for_selector("#runs tbody tr[data-ref]")
    ref = page.locator("#runs tbody tr[data-ref]").first.get_attribute("data-ref")
    post = f"{url}/api/runs/{urllib.parse.quote(ref)}/scores"
    body = {"name": "helpfulness", "value": 0.9}
    assert httpx.post(post, json=body, timeout=30).status_code == 401  # no read token
    read = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(post, json=body, headers=read, timeout=30).status_code == 403  # the read token alone
    assert httpx.post(post, json=body, headers={**read, "X-Agenttape-Annotate-Token": TOKEN}, timeout=30).status_code == 403
    assert httpx.post(post, json=body, headers=read, cookies={"x-agenttape-annotate-token": ANNOTATE},
                      timeout=30).status_code == 403  # a cookie is never read
    assert get(f"{url}/api/runs/{urllib.parse.quote(ref)}/scores", headers=read).json()["scores"] == []

    go(page, url, f"#/run/{urllib.parse.quote(ref)}")
    page.wait_for_selector("#annotate")
    assert page.inner_text("#scores-empty") == "No scores yet."
    page.fill("#annotate input[name=annotate_token]", "wrong-token")
    page.fill("#annotate input[name=name]", "helpfulness")
    page.fill("#annotate input[name=value]", "0.9")
    page.fill("#annotate input[name=comment]", XSS_SCRIPT)
    page.click("#annotate button[type=submit]")
    page.wait_for_selector("#annotate-status:has-text('annotate token')")
    assert page.locator("#scores li").count() == 0
    page.screenshot(path=str(shots / "21-annotate-refused.png"), full_page=True)
    page.fill("#annotate input[name=annotate_token]", ANNOTATE)
    page.click("#annotate button[type=submit]")
    page.wait_for_selector("#scores li.score-row")
    row = page.inner_text("#scores li.score-row")
    assert "helpfulness 0.9" in row and "human" in row and XSS_SCRIPT in row  # the comment, as text
    assert "node" not in row  # a score of the run itself
    assert page.evaluate("window.__xss") is None
    # a node of the run, with a label: the token is kept for the session, its field hidden
    assert not page.locator("#annotate input[name=annotate_token]").is_visible()
    node = page.locator("#annotate select[name=span_id] option").nth(1).get_attribute("value")
    page.select_option("#annotate select[name=span_id]", node)
    page.fill("#annotate input[name=name]", "correctness")
    page.fill("#annotate input[name=label]", "pass")
    page.click("#annotate button[type=submit]")
    page.locator("#scores li.score-row").nth(1).wait_for()
    assert "node " + node[:8] in page.inner_text("#scores")
    page.screenshot(path=str(shots / "22-annotated-run.png"), full_page=True)
    stored = get(f"{url}/api/runs/{urllib.parse.quote(ref)}/scores", headers=read).json()["scores"]
    assert sorted((s["name"], s["value"], s["label"], s["source"], s["span_id"] == node) for s in stored) == [
        ("correctness", None, "pass", "human", True), ("helpfulness", 0.9, None, "human", False)]

    go(page, url, "#/?score=" + urllib.parse.quote("helpfulness>=0.5"))
    page.wait_for_selector("#runs tbody tr[data-ref]")
    assert [r.get_attribute("data-ref") for r in page.locator("#runs tbody tr[data-ref]").all()] == [ref]
    header = page.locator("#runs thead th").all_text_contents()
    cell = page.locator("#runs tbody tr[data-ref] td").nth(header.index("scores")).inner_text()
    assert "helpfulness 0.9" in cell and "correctness pass" in cell
    page.screenshot(path=str(shots / "23-runs-by-score.png"))
    go(page, url, "#/?label=" + urllib.parse.quote("correctness=fail"))
    page.wait_for_selector("#runs td.empty")


def test_hostile_content_stays_inert_text(page, console, shots):
    url, ids, _ = console
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    go(page, url, "#/")
    page.wait_for_selector("#runs tbody tr[data-ref]")
    ref = page.locator("#runs tbody tr[data-ref]").first.get_attribute("data-ref")
    assert ref.split("@")[0] == ids["hostile"]
    for tab in ("steps", "nodes", "replay"):
        go(page, url, f"#/run/{urllib.parse.quote(ref)}?tab={tab}")
        page.wait_for_selector(f"#panel-{tab} > *")
        page.hover("main h1")
        page.screenshot(path=str(shots / f"12-hostile-{tab}.png"), full_page=True)
        text = page.inner_text("main")
        assert XSS_TOOL_RESULT in text or tab == "replay"
        assert "<script>" in text
        # nothing from the content became an element
        assert page.locator("main img, main script, main b, main i, main iframe").count() == 0
    go(page, url, f"#/tree/{urllib.parse.quote(ref)}")
    assert page.locator("#graph img, #graph script").count() == 0
    assert page.evaluate("() => window.__xss === undefined")
    assert not [u for u in requests if "/xss-" in u], requests


def test_requests_without_the_token_are_refused(console, browser, shots):
    url, ids, _ = console
    for path in ("/api/runs", "/api/info", f"/api/runs/{ids['demo']['run_id']}/steps", "/api/verify",
                 f"/api/runs/{ids['demo']['run_id']}/otlp"):
        r = get(url + path)
        assert r.status_code == 401, path
        assert "agenttape" not in r.text.replace("agenttape\"", "")  # no content in the refusal
        assert get(url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert get(url + "/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    context = browser.new_context()
    pg = context.new_page()
    pg.goto(url + "/")
    pg.wait_for_selector("#login")
    assert pg.locator("#runs").count() == 0
    pg.fill("#token", "not-the-token")
    pg.click("#login button[type=submit]")
    pg.wait_for_selector("#login .error")
    assert "refused" in pg.inner_text("#login")
    pg.screenshot(path=str(shots / "13-login.png"))
    context.close()


def test_new_runs_appear_without_a_reload(page, console, shots):
    url, ids, server = console
    marker = page.evaluate("() => { window.__marker = 42; return window.__marker; }")
    assert marker == 42
    tape = recorder(server, "late-app")
    try:
        with tape.run(agent="late-arrival", input="hello") as run:
            run.set_output("arrived")
    finally:
        tape.shutdown()
    assert server.wait_idle(30)
    page.wait_for_selector("#runs td.agent a:text-is('late-arrival')", timeout=15000)
    assert page.evaluate("() => window.__marker") == 42  # the same page: no reload
    page.screenshot(path=str(shots / "14-live.png"))


def test_a_tampered_store_shows_the_broken_badge(tmp_path, browser, shots):
    db = tmp_path / "demo.duckdb"
    proc = subprocess.run([sys.executable, "-m", "otel_agenttape", "demo", "--db", str(db), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    con = duckdb.connect(str(db))
    changed = con.execute(
        "UPDATE spans SET attributes = replace(CAST(attributes AS VARCHAR), 'OTLP collector load balancing', "
        "'something else entirely')::JSON WHERE tool_name = 'web_search' AND contains(CAST(attributes AS VARCHAR), "
        "'OTLP collector load balancing') RETURNING span_id").fetchall()
    con.close()
    assert len(changed) == 1
    with AgenttapeServe(db) as server:  # served again, as recorded and then edited
        url = server.url
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        pg = context.new_page()
        pg.goto(url + "/")
        pg.wait_for_selector("#runs .vbadge.broken")
        badges = pg.locator("#runs .vcell").all_inner_texts()
        assert all(b.startswith("broken at ") for b in badges), badges
        pg.screenshot(path=str(shots / "15-tampered-runs.png"))
        pg.click("#runs .vbadge.broken >> nth=0")
        pg.wait_for_selector("#tapes section.tape.broken")
        text = pg.inner_text("#tapes")
        assert re.search(r"broken at index \d+", text)
        assert "agenttape.ephemeral" in text  # the checkpoint's signer
        pg.screenshot(path=str(shots / "16-tampered-verify.png"), full_page=True)
        context.close()
