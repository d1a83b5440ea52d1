"""Every Python and shell code block of README.md and docs/*.md runs as written, one test case each.

A block fenced ```python / ```py runs with this interpreter; ```bash / ```sh / ```console / ```shell
runs with ``bash -e``, with ``agenttape`` and ``python`` on PATH. Other fences (text, json, yaml, ...)
are output and are not run. A shell block whose lines start with ``$ `` is a transcript: each ``$``
command runs in turn and the lines under it are what it prints; the first printed line must match
once numbers, hex ids and times are set aside (``...`` as the first line: it must appear somewhere),
and a command shown printing ``agenttape: error:`` must fail. A Python block whose first line is
``# NAME.py`` is that file: it is written into the folder of every block (so ``python agent.py`` in
a later block finds it) and, unless the next block runs it, runs itself.

Each block runs in a fresh temporary folder prepared as the docs assume (see ``WORLD``): the demo's
store ``agenttape.duckdb`` (``agenttape demo``), ``tapes.duckdb`` with the runs the API guide
records (run-1, run-2 signed by ``signer.key``, coord-1 with its children, run-r1, run-ev-1, two runs
named nightly-report), their key and checkpoint files, ``nodes.jsonl`` and the docs' named files.
Nothing is reached but 127.0.0.1: the ports the docs name (4317, 4318, 4380, ...) are rewritten to
free ports of this machine (a closed one when no server is asked for), ``0.0.0.0`` to 127.0.0.1,
proxies point at a closed port and the model API keys are dummies.

A block is marked with an HTML comment right before its fence (blank lines between are allowed),
``<!-- docs-test: DIRECTIVE; DIRECTIVE ... -->``:

- ``continue``: runs in the folder of the previous block, with its server, and for Python in its
  namespace (the previous Python blocks of the chain run first in the same process).
- ``needs-server``: a real ``agenttape serve`` runs on ``tapes.duckdb`` of the folder (free
  127.0.0.1 ports, the docs' 4318/4317 rewritten to them); ``needs-server: FILE`` serves FILE.
- ``needs-s3: BUCKET``: the AWS variables point at a local S3 server (moto, 127.0.0.1) with BUCKET.
- ``empty-store``: the folder has no ``tapes.duckdb`` yet (the doc records its own first).
- ``serves``: each command (or the Python block) is a server: it must print its startup line and
  keep running; it is then stopped.
- ``OLD=NEW``: the text OLD is replaced by NEW before the block runs (a placeholder such as
  ``RUN_REF``; in a shell block NEW may be ``"$(command)"``).
- ``setup: CODE`` (last): code in the block's language that runs first (for a fragment, the names
  the reader's own program would define).
- ``file NAME``: on an output block (json, ...): its text is the file NAME of every folder.
- ``skip: REASON`` (last): not run, only where running is impossible here (Docker, Kubernetes, a
  cloud account, a real API key, installing packages). Skips are listed in the test report.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from capture_servers import free_ports

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGS = {"python": "python", "py": "python", "bash": "sh", "sh": "sh", "console": "sh", "shell": "sh"}
DOC_PORTS = ("4317", "4318", "4380", "14317", "14318", "24317", "24318")
PORT_RE = re.compile(r"(?<![\d.\w])(" + "|".join(DOC_PORTS) + r")(?!\d)")
BLOCK_TIMEOUT = 90  # seconds, per command
BIN = Path(sys.executable).parent
ERROR_PREFIX = "agenttape: error:"

# What the docs assume exists before a block runs (in that order, against a server on tapes.duckdb
# in a folder that holds the docs' named files): the API guide's recorded runs, signed with the CLI
# guide's key (scale-out.md verifies every tape of a lake with it).
WORLD = [
    "agenttape demo --db agenttape.duckdb --json > /dev/null",
    "agenttape keygen --out signer --name example.org/agent > /dev/null",  # the agents below sign with it
    "python agent.py",
    "python outbox_agent.py",
    "AGENTTAPE_SIGNING_KEY=signer.key AGENTTAPE_CHECKPOINTS=checkpoints.jsonl python agent.py run-2",
    "python team.py",
    "python resume_capture.py",
    "python listener_demo.py",
    "python local_demo.py",
    f"python {ROOT / 'tests' / 'read_nightly.py'} http://127.0.0.1:4318 1",
    f"python {ROOT / 'tests' / 'read_nightly.py'} http://127.0.0.1:4318 2",
    "python -c 'import docs_fragments as f, json, sys; json.dump(f.openinference_trace(), sys.stdout)' "
    "> openinference.json",
]
WORLD_DOC = "docs/api.md"  # whose named files (agent.py, team.py, ...) the world runs


@dataclass
class Block:
    doc: str
    line: int
    lang: str  # "python", "sh" or the fence's language for a file block
    code: str
    marks: dict[str, Any]
    name: str | None = None  # "agent.py" for a block that starts "# agent.py"
    head: "Block | None" = None  # first block of its chain
    chain: list["Block"] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _parse_marks(comments: list[str]) -> dict[str, Any]:
    marks: dict[str, Any] = {"subs": []}
    for comment in comments:
        body = comment.strip()[4:-3].strip()
        if not body.startswith("docs-test:"):
            continue
        rest = body[len("docs-test:"):].strip()
        while rest:
            for last in ("skip:", "setup:"):
                if rest.startswith(last):
                    marks[last[:-1]] = rest[len(last):].strip()
                    rest = ""
                    break
            else:
                item, _, rest = rest.partition(";")
                item, rest = item.strip(), rest.strip()
                if item in ("continue", "empty-store", "serves"):
                    marks[item] = True
                elif item == "needs-server" or item.startswith("needs-server:"):
                    marks["needs-server"] = item.partition(":")[2].strip() or "tapes.duckdb"
                elif item.startswith("needs-s3:"):
                    marks["needs-s3"] = item.partition(":")[2].strip()
                elif item.startswith("file "):
                    marks["file"] = item[5:].strip()
                elif "=" in item:
                    old, _, new = item.partition("=")
                    marks["subs"].append((old.strip(), new.strip()))
                else:
                    raise ValueError(f"unknown docs-test directive {item!r}")
    return marks


def _collect() -> tuple[list[Block], list[Block]]:
    """(blocks that run, file blocks) of every doc, in document order, with chains linked."""
    runnable: list[Block] = []
    files: list[Block] = []
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").split("\n")
        rel = doc.relative_to(ROOT).as_posix()
        previous: Block | None = None
        i = 0
        while i < len(lines):
            stripped = lines[i].strip()
            if not stripped.startswith("```"):
                i += 1
                continue
            lang = stripped[3:].strip().split()[0] if stripped[3:].strip() else ""
            end = i + 1
            while not lines[end].strip().startswith("```"):
                end += 1
            indent = len(lines[i]) - len(lines[i].lstrip())
            code = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
            comments: list[str] = []
            j = i - 1
            while j >= 0 and (not lines[j].strip() or lines[j].strip().startswith("<!--")):
                if lines[j].strip():
                    comments.insert(0, lines[j])
                j -= 1
            marks = _parse_marks(comments)
            if "file" in marks:
                files.append(Block(rel, i + 1, lang, code, marks, name=marks["file"]))
            elif lang in LANGS:
                block = Block(rel, i + 1, LANGS[lang], code, marks)
                header = re.match(r"#\s*([\w.-]+\.py)\b", code)
                if block.lang == "python" and header:
                    block.name = header.group(1)
                if marks.get("continue") and previous is not None:
                    block.head = previous.head
                else:
                    block.head = block
                block.head.chain.append(block)
                runnable.append(block)
                previous = block
            i = end + 1
    return runnable, files


BLOCKS, FILE_BLOCKS = _collect()
NAMED = [b for b in BLOCKS if b.name]


def _rewrite(text: str, ports: dict[str, int]) -> str:
    text = PORT_RE.sub(lambda m: str(ports[m.group(1)]), text)
    return text.replace("0.0.0.0", "127.0.0.1")


def _env(ports: dict[str, int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENTTAPE_", "OTEL_", "PYTEST_", "OPENAI_AGENTS_")) and "PROXY" not in k.upper()}
    # (other test modules set OPENAI_AGENTS_DISABLE_TRACING when pytest imports them; a reader's shell has
    # none of these)
    dead = f"http://127.0.0.1:{ports['dead']}"
    env.update({
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "tests"), env.get("PYTHONPATH")) if p),
        "AGENTTAPE_HTTP_PORT": str(ports["4318"]),
        "AGENTTAPE_GRPC_PORT": str(ports["4317"]),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{ports['4318']}",
        "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead,
        "http_proxy": dead, "https_proxy": dead, "all_proxy": dead,
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "OPENAI_API_KEY": "sk-docs-test-offline", "ANTHROPIC_API_KEY": "sk-ant-docs-test-offline",
        "AGENTTAPE_CONSOLE_PORT": str(ports["4380"]),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _ports() -> dict[str, int]:
    names = (*DOC_PORTS, "dead")
    return dict(zip(names, free_ports(len(names))))  # distinct: two doc ports must never be one


def _write_named_files(folder: Path, ports: dict[str, int], doc: str) -> None:
    """Every doc's named files, the ones of ``doc`` last (two docs may show their own agent.py)."""
    for block in sorted(NAMED, key=lambda b: b.doc == doc):
        (folder / block.name).write_text(_rewrite(block.code, ports))
    for block in FILE_BLOCKS:
        (folder / block.name).write_text(_rewrite(block.code, ports))


class Server:
    """``agenttape serve`` on a folder's store, on the folder's ports."""

    def __init__(self, folder: Path, db: str, ports: dict[str, int], env: dict[str, str]) -> None:
        self.url = f"http://127.0.0.1:{ports['4318']}"
        self.proc = subprocess.Popen(
            [str(BIN / "agenttape"), "serve", "--db", db, "--http-port", str(ports["4318"]),
             "--grpc-port", str(ports["4317"]), "--ingest-workers", "0"],
            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"agenttape serve did not start: {self.proc.stdout.read()}")
            time.sleep(0.1)

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until every span the server accepted is stored: a block that reads the store right after
        one that recorded (a person runs them seconds apart) must not race the receiver's writer."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(self.url + "/metrics", timeout=10) as response:
                text = response.read().decode()
            accepted = _metric(text, "agenttape_spans_accepted_total")
            stored = _metric(text, "agenttape_spans_stored_total") + _metric(text, "agenttape_spans_duplicate_total")
            if stored >= accepted:
                return
            time.sleep(0.1)

    def stop(self) -> None:
        _stop(self.proc)


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)  # a stopping receiver publishes what it holds into its lake first
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    out, _ = proc.communicate()
    return out or ""


def _sh(command: str, folder: Path, env: dict[str, str], timeout: float = BLOCK_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-e", "-c", command], cwd=folder, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A folder holding what the docs assume exists (see WORLD)."""
    folder = tmp_path_factory.mktemp("docs-world")
    ports = _ports()
    env = _env(ports)
    _write_named_files(folder, ports, WORLD_DOC)
    demo = _sh(WORLD[0], folder, env, timeout=120)
    assert demo.returncode == 0, demo.stdout
    server = Server(folder, "tapes.duckdb", ports, env)
    try:
        done = _sh(WORLD[1], folder, env)
        assert done.returncode == 0, done.stdout
        env = {**env, "AGENTTAPE_SIGNING_KEY": "signer.key"}
        procs = [(command, subprocess.Popen(["bash", "-e", "-c", _rewrite(command, ports)], cwd=folder, env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                 for command in WORLD[2:]]  # independent recordings, at once
        for command, proc in procs:
            out, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
            assert proc.returncode == 0, f"{command}\n{out}"
    finally:
        server.stop()
    for path in folder.iterdir():  # the named files are written per folder, with its ports
        if path.suffix == ".py" or path.name.endswith(".serve.json"):
            path.unlink()
    return folder


@dataclass
class Chain:
    folder: Path
    ports: dict[str, int]
    env: dict[str, str]
    server: Server | None = None
    python: list[str] = field(default_factory=list)  # earlier unnamed Python blocks of the chain


CHAINS: dict[str, Chain] = {}
S3: list[Any] = []  # the moto S3 server, started for the first block that needs one


def _s3_env(bucket: str) -> dict[str, str]:
    """A local S3 server (moto, on 127.0.0.1) holding ``bucket``, as the AWS variables the docs name."""
    import boto3
    from moto.server import ThreadedMotoServer

    if not S3:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        S3.append(server)
    host, port = S3[0].get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    if bucket not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        client.create_bucket(Bucket=bucket)
    return env


@pytest.fixture(scope="module", autouse=True)
def _stop_servers():
    yield
    for chain in CHAINS.values():
        if chain.server:
            chain.server.stop()
    CHAINS.clear()
    while S3:
        S3.pop().stop()


def _chain(block: Block, world: Path, tmp_path_factory) -> Chain:
    head = block.head
    if head.id in CHAINS:
        return CHAINS[head.id]
    folder = tmp_path_factory.mktemp("docs-block")
    shutil.copytree(world, folder, dirs_exist_ok=True)
    if head.marks.get("empty-store"):
        for path in folder.glob("tapes.duckdb*"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    ports = _ports()
    chain = Chain(folder, ports, _env(ports))
    if head.marks.get("needs-s3"):
        chain.env.update(_s3_env(head.marks["needs-s3"]))
    _write_named_files(folder, ports, head.doc)
    if "needs-server" in head.marks:
        chain.server = Server(folder, head.marks["needs-server"], ports, chain.env)
    CHAINS[head.id] = chain
    return chain


def _prepare(block: Block, chain: Chain) -> str:
    code = block.code
    for old, new in block.marks["subs"]:
        code = code.replace(old, new)
    return _rewrite(code, chain.ports)


def _shape(line: str) -> str:
    """A printed line with what changes from run to run set aside."""
    line = re.sub(r"\d{4}-\d\d-\d\d[T ][\d:.]+", "<time>", line)
    line = re.sub(r"(?<![A-Za-z_])[0-9a-f]*\d[0-9a-f]*(?:\.\.\.[0-9a-f]+)?(?:\.\d+)?(?![A-Za-z_])", "<n>", line)
    return " ".join(line.split())


def _check_printed(command: str, expected: list[str], printed: str, failed: bool) -> None:
    expected = [line for line in expected if line.strip()]
    actual = [line for line in printed.splitlines() if line.strip()]
    if expected and expected[0].startswith(ERROR_PREFIX):
        assert failed, f"{command!r} was shown failing but succeeded:\n{printed}"
    else:
        assert not failed, f"{command!r} failed:\n{printed}"
    if not expected:
        return
    if expected[0].strip() == "...":
        want = _shape(expected[1])
        assert any(_shape(line) == want for line in actual), f"{command!r}: no line like\n  {expected[1]}\nin\n{printed}"
    else:
        assert actual and _shape(actual[0]) == _shape(expected[0]), (
            f"{command!r} printed\n  {actual[0] if actual else '(nothing)'}\nthe doc shows\n  {expected[0]}")


def _transcript(code: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def _serve(command: list[str] | str, chain: Chain, expected: list[str] | None) -> None:
    argv = ["bash", "-e", "-c", command] if isinstance(command, str) else command
    proc = subprocess.Popen(argv, cwd=chain.folder, env=chain.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        first = _read_line(proc, 60)
        time.sleep(0.5)
        alive = proc.poll() is None
    finally:
        rest = _stop(proc)
    assert first and alive, f"{command!r} did not keep serving:\n{first}{rest}"
    # it stopped by itself, and what it had to do at the stop (publish into its lake) was done
    assert proc.returncode != -signal.SIGKILL, f"{command!r} did not stop within 60 s of Ctrl-C:\n{first}{rest}"
    assert "failed" not in rest.lower(), f"{command!r} failed as it stopped:\n{first}{rest}"
    if expected:
        _check_printed(str(command), expected, first, failed=False)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The first line ``proc`` prints (what it printed by ``timeout`` if less)."""
    import selectors

    fd = proc.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data and time.monotonic() < deadline:
        if selector.select(timeout=max(0.0, deadline - time.monotonic())):
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    selector.close()
    return data.decode(errors="replace").split("\n", 1)[0] + ("\n" if b"\n" in data else "")


RUNNER = """
import ast, asyncio, sys
namespace = {"__name__": "__main__"}
loop = None
for path in sys.argv[1:]:
    sys.argv = [path]
    code = compile(open(path).read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)
    if asyncio.iscoroutine(result):  # a top-level await: every block of the chain on one loop
        loop = loop or asyncio.new_event_loop()
        loop.run_until_complete(result)
"""


def _setup(block: Block, chain: Chain) -> str | None:
    setup = block.marks.get("setup")
    return _rewrite(setup, chain.ports) if setup else None


def _run_python(block: Block, chain: Chain, code: str) -> None:
    setup = _setup(block, chain)
    if block.name:
        path = chain.folder / block.name
        path.write_text((setup + "\n" if setup else "") + code)
        if any(block.name in other.code for other in block.head.chain if other is not block):
            compile(path.read_text(), str(path), "exec")  # another block of its chain runs it
            return
        argv = [sys.executable, block.name]
    else:
        sources = list(chain.python)
        if setup:
            sources.append(setup + "\n")
        sources.append(code)
        paths = []
        for n, source in enumerate(sources):
            path = chain.folder / f"_docs_block_{block.line}_{n}.py"
            path.write_text(source)
            paths.append(path.name)
        chain.python.append(sources[-1] if not setup else setup + "\n" + code)
        argv = [sys.executable, "-c", RUNNER, *paths]
    if block.marks.get("serves"):
        _serve(argv, chain, None)
        return
    done = subprocess.run(argv, cwd=chain.folder, env=chain.env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT)
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout}"


SERVER_COMMAND = re.compile(r"^(\w+=\S+ )*agenttape (serve|console|demo --serve)\b")


def _run_shell(block: Block, chain: Chain, code: str) -> None:
    setup = _setup(block, chain)
    if any(line.startswith("$ ") for line in code.splitlines()):
        # the printed lines as the doc shows them (a placeholder is replaced in the commands only)
        for command, expected in _transcript(_rewrite(block.code, chain.ports)):
            for old, new in block.marks["subs"]:
                command = command.replace(old, new)
            if setup:  # once, before the first command
                command, setup = setup + "\n" + command, None
            if block.marks.get("serves") and SERVER_COMMAND.match(command.splitlines()[-1]):
                _serve(command, chain, expected)
                continue
            done = _sh(command, chain.folder, chain.env)
            _check_printed(command, expected, done.stdout, done.returncode != 0)
        return
    if block.marks.get("serves"):  # the server commands one at a time, after what comes before each
        before = [setup] if setup else []
        for line in code.splitlines():
            if SERVER_COMMAND.match(line.strip()):
                _serve("\n".join([*before, line]), chain, None)
            else:
                before.append(line)
        after = [line for line in before if line.strip() and not line.lstrip().startswith("#")]
        if after and not SERVER_COMMAND.match(code.strip().splitlines()[-1].strip()):
            done = _sh("\n".join(before), chain.folder, chain.env)
            assert done.returncode == 0, f"{block.id} failed:\n{code}\n---\n{done.stdout}"
        return
    done = _sh(((setup + "\n") if setup else "") + code, chain.folder, chain.env)
    assert done.returncode == 0, f"{block.id} failed:\n{code}\n---\n{done.stdout}"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block_runs(block: Block, world: Path, tmp_path_factory) -> None:
    if "skip" in block.marks:
        pytest.skip(block.marks["skip"])
    chain = _chain(block, world, tmp_path_factory)
    try:
        if chain.server:
            chain.server.settle()
        code = _prepare(block, chain)
        if block.lang == "python":
            _run_python(block, chain, code)
        else:
            _run_shell(block, chain, code)
    finally:
        if block is block.head.chain[-1]:
            if chain.server:
                chain.server.stop()
                chain.server = None


def test_markers_are_well_formed() -> None:
    """Every skip says why; a ``continue`` has a block to continue; file blocks are not run."""
    for block in BLOCKS:
        if "skip" in block.marks:
            assert block.marks["skip"], f"{block.id}: a skip needs its reason"
        if block.marks.get("continue"):
            assert block.head is not block, f"{block.id}: continue on the first block of {block.doc}"
    assert len(BLOCKS) >= 90
    skipped = [b for b in BLOCKS if "skip" in b.marks]
    assert len(skipped) <= len(BLOCKS) // 4, [b.id for b in skipped]


if __name__ == "__main__":  # list the blocks and their marks
    for b in BLOCKS:
        print(b.id, b.lang, b.name or "", {k: v for k, v in b.marks.items() if v}, textwrap.shorten(b.code, 60))
