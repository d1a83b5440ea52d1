"""The console's read API over HTTP (uvicorn on 127.0.0.1) on a store the demo recorded: every endpoint,
its errors, the token gate, the OTLP download that `agenttape ingest` takes back, and `agenttape console`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import otel_agenttape
from console_app import serve_console
from otel_agenttape.console.serve import ConsoleError, check_bind, is_loopback, open_tapes

def get(url: str, **kwargs) -> httpx.Response:
    """A GET with room for a loaded machine (the default 5 s is short for a store scan under load)."""
    return httpx.get(url, timeout=120, **kwargs)


STATIC = Path(otel_agenttape.__file__).parent / "console" / "static"


def agenttape(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_agenttape", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("console-api")
    db = folder / "demo.duckdb"
    proc = agenttape("demo", "--db", str(db), "--json", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder, db, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def api(demo):
    folder, db, out = demo
    tapes = open_tapes(db=str(db))
    with serve_console(tapes) as url:
        with httpx.Client(base_url=url + "/api", timeout=30) as client:
            yield client, out, folder, db
    tapes.close()


def refs_by_agent(client) -> dict[str, str]:
    return {r["agent"]: r["ref"] for r in client.get("/runs").json()["runs"]}


def test_runs_newest_first_with_total_filters_and_a_cursor(api):
    client, out, _, _ = api
    page = client.get("/runs").json()
    assert page["total"] == 3 and page["next_cursor"] is None
    starts = [r["start_ns"] for r in page["runs"]]
    assert starts == sorted(starts, reverse=True)
    assert {r["agent"] for r in page["runs"]} == {"coordinator", "researcher", "critic"}
    # one at a time: the cursor walks every run once
    seen, cursor = [], None
    while True:
        p = client.get("/runs", params={"limit": 1, **({"cursor": cursor} if cursor else {})}).json()
        assert p["total"] == 3
        seen += [r["ref"] for r in p["runs"]]
        cursor = p["next_cursor"]
        if not cursor:
            break
    assert seen == [r["ref"] for r in page["runs"]]
    agents = lambda **q: sorted(r["agent"] for r in client.get("/runs", params=q).json()["runs"])  # noqa: E731
    assert agents(agent="critic") == ["critic"]
    assert agents(tool="fetch_page") == ["researcher"]
    assert agents(model="demo-model-1") == ["coordinator", "critic", "researcher"]
    assert agents(session="demo-session", service="agenttape-demo", status="completed") == [
        "coordinator", "critic", "researcher"]
    # free text over content (the read model matches it anywhere in a run's trace: the demo is one trace)
    assert agents(text="payload size limits") == ["coordinator", "critic", "researcher"]
    assert agents(q="payload size limits") == agents(text="payload size limits")
    assert agents(text="words no span holds") == []
    assert agents(since="2100-01-01") == [] and agents(until="2100-01-01") == ["coordinator", "critic", "researcher"]
    assert agents(agent="nobody") == []


def test_one_run_its_steps_nodes_spans_and_tree(api):
    client, out, folder, db = api
    refs = refs_by_agent(client)
    run = client.get(f"/runs/{refs['researcher']}").json()
    assert run["agent"] == "researcher" and run["tool_calls"] == 3 and run["errors"] == 1
    assert run["parent_ref"] == refs["coordinator"]
    steps = client.get(f"/runs/{refs['researcher']}/steps").json()["steps"]
    kinds = [s["kind"] for s in steps]
    assert kinds[0] == "input" and kinds[-1] == "terminal" and kinds.count("tool_result") == 3
    assert [s["index"] for s in steps] == list(range(len(steps)))
    nodes = client.get(f"/runs/{refs['researcher']}/nodes").json()
    assert [n["type"] for n in nodes["nodes"]] == ["model", "tool", "tool", "tool", "model"]
    assert nodes["nodes"][0]["input"][0] == {"role": "system", "content": "You are the researcher. Be brief."}
    assert nodes["totals"]["tool_calls"] == 3 and nodes["totals"]["usage"]["input_tokens"] == run["input_tokens"]
    spans = client.get(f"/runs/{refs['researcher']}/spans").json()
    assert len(spans["spans"]) == 6 and spans["spans"][0]["depth"] == 0
    assert {s["depth"] for s in spans["spans"][1:]} == {1}
    tree = client.get(f"/runs/{refs['coordinator']}/tree").json()
    assert tree["runs"] == 3
    kids = {c["agent"]: c for c in tree["root"]["children"]}
    assert set(kids) == {"researcher", "critic"}
    assert [t["name"] for t in kids["researcher"]["tool_list"]].count("web_search") == 2
    assert kids["critic"]["output_preview"].startswith("Risks:")
    assert kids["critic"]["ref"].split("@")[0] == out["children"]["critic"]


def test_replay_is_what_the_cli_prints(api):
    client, out, folder, db = api
    ref = refs_by_agent(client)["coordinator"]
    for extra, params in (([], {}), (["--tree"], {"tree": "1"})):
        proc = agenttape("replay", ref, *extra, "--json", "--db", str(db), cwd=folder)
        assert proc.returncode == 0, proc.stderr
        assert client.get(f"/runs/{ref}/replay", params=params).json() == json.loads(proc.stdout)


def test_session_diff_and_verification(api):
    client, out, _, _ = api
    refs = refs_by_agent(client)
    turns = client.get("/sessions/demo-session").json()["turns"]
    assert [t["agent"] for t in turns] == ["coordinator", "researcher", "critic"]  # oldest first
    assert turns[0]["output"].startswith("Recommendation:")
    same = client.get("/diff", params={"a": refs["critic"], "b": refs["critic"]}).json()
    assert same["diverged"] is False and same["first_divergence"] is None
    d = client.get("/diff", params={"a": refs["researcher"], "b": refs["critic"]}).json()
    assert d["diverged"] is True and d["first_divergence"]["index"] == 0
    assert len(d["nodes_a"]) == 5 and len(d["nodes_b"]) == 1
    tapes = client.get("/verify").json()["tapes"]
    assert len(tapes) == 1 and tapes[0]["valid"] is True and tapes[0]["chain_id"] == out["run_id"]
    cps = tapes[0]["checkpoints"]
    assert cps and cps[-1]["size"] == tapes[0]["length"] and cps[-1]["signatures"][0]["key"]
    assert client.get("/verify", params={"tape": out["run_id"]}).json()["tapes"][0]["valid"] is True


def test_errors_are_clear(api):
    client, *_ = api
    r = client.get("/runs/0123456789abcdef0123456789abcdef/steps")
    assert r.status_code == 404 and "not found" in r.json()["error"]
    assert client.get("/runs", params={"limit": "x"}).status_code == 400
    assert client.get("/runs", params={"limit": 0}).status_code == 400
    assert client.get("/runs", params={"since": "yesterday-ish"}).status_code == 400
    assert client.get("/runs", params={"cursor": "!!"}).status_code == 400
    assert client.get("/diff", params={"a": "x"}).status_code == 400
    assert client.get("/nothing/here").status_code == 404


def test_the_page_is_self_contained_and_guarded(api):
    client, *_ = api
    base = str(client.base_url).rstrip("/").removesuffix("/api")
    page = get(base + "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
    for f in STATIC.glob("*.js"):
        assets += [f"/static/{m}" for m in re.findall(r'from "\./([^"]+)"', f.read_text())]
    assert len(set(assets)) >= 8
    for a in set(assets):
        assert get(base + a).status_code == 200, a
    # nothing is loaded from elsewhere: no URL to another host in any asset, no CDN, no web font
    for f in STATIC.iterdir():
        text = f.read_text()
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), f
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text and "document.write" not in text, f


def test_the_otlp_download_goes_back_in_with_ingest(api, tmp_path):
    client, out, folder, db = api
    ref = refs_by_agent(client)["researcher"]
    r = client.get(f"/runs/{ref}/otlp")
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    doc = r.json()
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(spans) == 6
    path = tmp_path / "researcher.otlp.json"
    path.write_bytes(r.content)
    copy = tmp_path / "copy.duckdb"
    proc = agenttape("ingest", str(path), "--db", str(copy), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["spans"] == 6
    with otel_agenttape.open(str(copy)) as again:
        assert again.replay(ref) == client.get(f"/runs/{ref}/replay").json()
    # the file itself opens in the console, like any exported OTLP file
    tapes = open_tapes(files=[str(path)])
    with serve_console(tapes) as url:
        listed = get(url + "/api/runs").json()["runs"]
        assert [x["ref"] for x in listed] == [ref]
    tapes.close()


def test_a_token_gates_every_read(demo):
    folder, db, out = demo
    tapes = open_tapes(db=str(db))
    with serve_console(tapes, token="s3cret") as url:
        for path in ("/api/runs", "/api/info", "/api/verify", f"/api/runs/{out['run_id']}",
                     f"/api/runs/{out['run_id']}/otlp", "/api/sessions/demo-session"):
            r = get(url + path)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert out["run_id"] not in r.text
            assert get(url + path, headers={"Authorization": "Bearer s3cre"}).status_code == 401
        assert get(url + "/api/runs", headers={"Authorization": "Bearer s3cret"}).json()["total"] == 3
        assert get(url + "/").status_code == 200  # the page holds no content; it asks for the token
    tapes.close()


def test_no_token_means_loopback_only():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        assert is_loopback(host)
        check_bind(host, None)
    for host in ("0.0.0.0", "::", "192.168.1.10"):
        assert not is_loopback(host)
        with pytest.raises(ConsoleError, match="without a token"):
            check_bind(host, None)
        check_bind(host, "t")
        check_bind(host, None, insecure_no_auth=True)


def test_agenttape_console_command(demo, tmp_path):
    folder, db, out = demo
    proc = agenttape("console", "--db", str(db), "--host", "0.0.0.0", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and "without a token" in proc.stderr
    proc = agenttape("console", "--db", str(tmp_path / "missing.duckdb"), "--port", "0", cwd=tmp_path)
    assert proc.returncode == 2 and "no tape store" in proc.stderr
    server = subprocess.Popen([sys.executable, "-m", "otel_agenttape", "console", "--db", str(db), "--port", "0",
                               "--token", "t0k", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path)
    try:
        line = server.stdout.readline()
        info = json.loads(line)
        assert info["token_required"] is True and info["url"].startswith("http://127.0.0.1:")
        r = get(info["url"] + "api/runs", headers={"Authorization": "Bearer t0k"})
        assert r.json()["total"] == 3
    finally:
        server.terminate()
        server.wait(20)
    deadline = time.monotonic() + 5
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.returncode == 0


def test_agenttape_console_command_on_exported_files(api, tmp_path):
    """`agenttape console FILE...`: a user sent OTLP files opens them with one command, no receiver."""
    import gzip

    client, out, folder, db = api
    refs = refs_by_agent(client)
    (tmp_path / "researcher.json").write_bytes(client.get(f"/runs/{refs['researcher']}/otlp").content)
    (tmp_path / "critic.json.gz").write_bytes(gzip.compress(client.get(f"/runs/{refs['critic']}/otlp").content))
    files = [str(tmp_path / "researcher.json"), str(tmp_path / "critic.json.gz")]
    server = subprocess.Popen([sys.executable, "-m", "otel_agenttape", "console", *files, "--port", "0", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = server.stdout.readline()
        assert line, server.stderr.read()
        info = json.loads(line)
        assert info["token_required"] is False and info["url"].startswith("http://127.0.0.1:")
        body = get(info["url"] + "api/runs").json()
        assert body["total"] == 2
        assert sorted((r["agent"], r["ref"]) for r in body["runs"]) == [
            ("critic", refs["critic"]), ("researcher", refs["researcher"])]
        steps = get(info["url"] + f"api/runs/{refs['researcher']}/steps").json()["steps"]
        assert steps == client.get(f"/runs/{refs['researcher']}/steps").json()["steps"]
    finally:
        server.terminate()
        assert server.wait(20) == 0
    # a file that is not OTLP is refused with the reason, before anything listens
    bad = tmp_path / "notes.txt"
    bad.write_text("not a trace")
    proc = agenttape("console", str(bad), "--port", "0", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and "cannot open" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_demo_ends_with_the_console_and_serves_it(tmp_path):
    proc = agenttape("demo", "--db", str(tmp_path / "a.duckdb"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().splitlines()[-2].startswith("See it in the browser: agenttape console --db ")
    assert "http://127.0.0.1:4380/" in proc.stdout
    assert agenttape("demo", "--json", "--serve", cwd=tmp_path).returncode == 2
    server = subprocess.Popen([sys.executable, "-m", "otel_agenttape", "demo", "--db", str(tmp_path / "b.duckdb"),
                               "--serve", "--console-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path)
    try:
        url = None
        for line in server.stdout:
            m = re.match(r"Console: (http://127\.0\.0\.1:\d+/)", line)
            if m:
                url = m.group(1)
                break
        assert url, server.stderr.read()
        runs = get(url + "api/runs").json()["runs"]
        assert sorted(r["agent"] for r in runs) == ["coordinator", "critic", "researcher"]
        assert get(url).status_code == 200
    finally:
        server.terminate()
        assert server.wait(20) == 0


def test_a_parquet_lake_reads_the_same(demo, tmp_path):
    folder, db, out = demo
    lake = tmp_path / "lake"
    assert agenttape("export", "parquet", str(lake), "--db", str(db), cwd=tmp_path).returncode == 0
    tapes = open_tapes(lake=str(lake))
    with serve_console(tapes) as url:
        runs = get(url + "/api/runs").json()["runs"]
        assert sorted(r["agent"] for r in runs) == ["coordinator", "critic", "researcher"]
        root = next(r["ref"] for r in runs if r["agent"] == "coordinator")
        assert get(url + f"/api/runs/{root}/tree").json()["runs"] == 3
        assert get(url + "/api/verify").json()["tapes"][0]["valid"] is True
    tapes.close()
    with pytest.raises(ConsoleError, match="no Parquet lake"):
        open_tapes(lake=str(tmp_path / "nowhere"))
