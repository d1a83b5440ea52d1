"""The package layering of DESIGN.md holds: each package imports only from the layers below it.

An agent process must not need DuckDB or servers (capture never imports store/receiver/tape), and
command-line code stays at the top.
"""

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "otel_agenttape"

LAYER = {
    "codec": 0,  # value and wire encodings: import nothing else of the package but ``native``,
    "native": 0,  # which finds their compiled twins and imports nothing of the package itself
    "semconv": 1, "pricing": 1, "anyvalue": 1, "atomicfile": 1, "outboxfile": 1, "walfile": 1,
    "read_memory": 1,  # the one bound on what the read model (tape) keeps; the receiver sets it
    "integrity": 2, "resume": 2,
    "capture": 3, "store": 3,
    "receiver": 4, "tape": 4, "sessions": 4, "integrations": 4,
    "cli": 5, "commands": 5, "console": 5, "demo": 5, "doctor": 5, "__main__": 5, "__init__": 5, "sources": 5,  # the package facade re-exports setup()
}
TOP = 5  # the command line: its modules may import one another
# Same-layer imports that the design names explicitly.
ALLOWED = {("outboxfile", "atomicfile"),  # both layer 1: the outbox syncs its folder with the shared helper
           ("codec", "native"),  # both layer 0: an encoding finds its compiled twin
           ("capture", "integrity"), ("capture", "resume"), ("tape", "store"), ("receiver", "store"),
           ("tape", "integrity"), ("tape", "resume")}
FORBIDDEN_THIRD_PARTY = {"codec": {"duckdb", "pyarrow", "grpc"}, "integrity": {"duckdb", "grpc"},
                         "resume": {"duckdb", "grpc"}, "capture": {"duckdb", "pyarrow"}, "integrations": {"duckdb", "pyarrow", "grpc"}}
# Lower layers a unit still must not import: framework adapters run in the agent process, beside capture.
FORBIDDEN_INTERNAL = {"integrations": {"store", "receiver", "tape"}}


def _unit(path: Path, pkg: Path = PKG) -> str:
    rel = path.relative_to(pkg).parts
    return rel[0].removesuffix(".py").removesuffix(".pyx") if len(rel) == 1 else rel[0]


_PYX_IMPORT = re.compile(r"^\s*(?:from\s+(\.*[\w.]*)\s+c?import\s+(.+)|c?import\s+(.+))$")
_IMPORT_CALL = re.compile(r"import_module\(\s*[\"'](otel_agenttape(?:\.\w+)*)[\"']")


def _names(text: str) -> list[str]:
    return [n.strip().split(" as ")[0].strip("() ") for n in text.split(",") if n.strip().strip("()")]


def _resolve(rel_parts: tuple[str, ...], level: int, module: str | None) -> str:
    """The absolute module a ``from`` import names (``level`` dots, then ``module``)."""
    if not level:
        return module or ""
    base = list(rel_parts[:-1])[: len(rel_parts) - level]
    return ".".join(["otel_agenttape", *base] + ([module] if module else []))


def _imports(path: Path, pkg: Path = PKG):
    """Every module a file imports, in every form: ``import a.b``, ``from a import b`` (``a.b`` too, since b
    may be a module), relative imports, ``importlib.import_module("...")`` and Cython's ``cimport``."""
    text = path.read_text()
    rel_parts = path.relative_to(pkg).parts
    yield from _IMPORT_CALL.findall(text)
    if path.suffix == ".pyx":
        for line in text.splitlines():
            m = _PYX_IMPORT.match(line.split("#")[0].rstrip())
            if not m:
                continue
            if m.group(3):
                yield from _names(m.group(3))
                continue
            dots = len(m.group(1)) - len(m.group(1).lstrip("."))
            mod = _resolve(rel_parts, dots, m.group(1).lstrip(".") or None)
            yield mod
            yield from (f"{mod}.{n}" for n in _names(m.group(2)) if n != "*")
        return
    tree = ast.parse(text, filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(rel_parts, node.level, node.module)
            if mod:
                yield mod
            for alias in node.names:
                if alias.name != "*":
                    yield f"{mod}.{alias.name}" if mod else alias.name


def layer_problems(pkg: Path = PKG) -> list[str]:
    """Every import in ``pkg`` (``.py`` and ``.pyx``) that crosses the layers the wrong way."""
    problems = []
    files = sorted([*pkg.rglob("*.py"), *pkg.rglob("*.pyx")])
    for path in files:
        unit = _unit(path, pkg)
        if unit not in LAYER:
            problems.append(f"{path.relative_to(pkg)}: unit {unit!r} has no layer")
            continue
        for name in _imports(path, pkg):
            parts = name.split(".")
            if parts[0] == "otel_agenttape" and len(parts) > 1:
                target = parts[1]
                if target not in LAYER or target == unit:
                    continue
                ok = (LAYER[target] < LAYER[unit] or (unit, target) in ALLOWED
                      or LAYER[unit] == LAYER[target] == TOP) and target not in FORBIDDEN_INTERNAL.get(unit, ())
                if not ok:
                    problems.append(f"{path.relative_to(pkg)} imports {name} (layer {LAYER[target]} from {LAYER[unit]})")
            elif parts[0] in FORBIDDEN_THIRD_PARTY.get(unit, ()):
                problems.append(f"{path.relative_to(pkg)} imports {name}")
    return sorted(set(problems))


def test_every_import_respects_the_layers():
    problems = layer_problems()
    assert not problems, "\n".join(problems)


PLANTED = {
    "absolute": "import otel_agenttape.store\n",
    "absolute_from": "from otel_agenttape.store import writer\n",
    "package_from": "from otel_agenttape import store\n",
    "relative_parent": "from .. import store\n",
    "relative_module": "from ..store.writer import Store\n",
    "dynamic": "import importlib\nimportlib.import_module('otel_agenttape.receiver')\n",
    "third_party": "import duckdb\n",
}


@pytest.mark.parametrize("form", sorted(PLANTED))
def test_a_planted_wrong_import_of_each_form_fails(tmp_path: Path, form: str) -> None:
    pkg = tmp_path / "otel_agenttape"
    for sub in ("capture", "store", "receiver"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "capture" / "api.py").write_text(PLANTED[form])
    assert layer_problems(pkg), f"the {form} form of a wrong import went unnoticed"
    (pkg / "capture" / "api.py").write_text("from . import sealing\nfrom otel_agenttape import semconv\n")
    assert not layer_problems(pkg)


@pytest.mark.parametrize("line", ["from otel_agenttape.store.writer cimport Store",
                                  "from otel_agenttape.store import rows",
                                  "cimport otel_agenttape.tape.model",
                                  "from ..receiver import http"])
def test_a_planted_wrong_import_in_a_pyx_fails(tmp_path: Path, line: str) -> None:
    pkg = tmp_path / "otel_agenttape"
    for sub in ("capture", "store", "receiver", "tape"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "capture" / "_fast.pyx").write_text(f"# cython: language_level=3\n{line}\n")
    assert layer_problems(pkg)


def test_a_framework_adapter_importing_the_store_fails(tmp_path: Path) -> None:
    pkg = tmp_path / "otel_agenttape"
    for sub in ("integrations", "store", "capture"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "integrations" / "openai_agents.py").write_text("from ..store.writer import Store\n")
    assert layer_problems(pkg)
    (pkg / "integrations" / "openai_agents.py").write_text("from ..capture.api import current_run\n")
    assert not layer_problems(pkg)


def test_the_codec_imports_nothing_else_of_the_package(tmp_path: Path) -> None:
    pkg = tmp_path / "otel_agenttape"
    (pkg / "codec").mkdir(parents=True)
    (pkg / "codec" / "__init__.py").write_text("")
    (pkg / "semconv.py").write_text("")
    (pkg / "codec" / "typed.py").write_text("from .. import semconv\n")
    assert layer_problems(pkg)
    (pkg / "codec" / "typed.py").write_text("from otel_agenttape.codec import jsontext\nimport orjson\n")
    assert not layer_problems(pkg)
