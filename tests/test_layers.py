"""The package layering of DESIGN.md holds: each package imports only from the layers below it.

An agent process must not need DuckDB or servers (capture never imports store/receiver/tape), and
command-line code stays at the top.
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "otel_agenttape"

LAYER = {
    "semconv": 0, "anyvalue": 0, "atomicfile": 0, "native": 0,
    "integrity": 1, "resume": 1,
    "capture": 2, "store": 2,
    "receiver": 3, "tape": 3, "sessions": 3,
    "cli": 4, "commands": 4, "console": 4, "demo": 4, "doctor": 4, "__main__": 4, "__init__": 4,  # the package facade re-exports setup()
}
TOP = 4  # the command line: its modules may import one another
# Same-layer imports that the design names explicitly.
ALLOWED = {("capture", "integrity"), ("capture", "resume"), ("tape", "store"), ("receiver", "store"),
           ("tape", "integrity"), ("tape", "resume")}
FORBIDDEN_THIRD_PARTY = {"integrity": {"duckdb", "grpc"}, "resume": {"duckdb", "grpc"},
                         "capture": {"duckdb", "pyarrow"}}


def _unit(path: Path) -> str:
    rel = path.relative_to(PKG).parts
    return rel[0].removesuffix(".py") if len(rel) == 1 else rel[0]


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    rel_parts = path.relative_to(PKG).parts
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = list(rel_parts[:-1])[: len(rel_parts) - node.level]
                mod = ".".join(["otel_agenttape", *base] + ([node.module] if node.module else []))
                yield mod
            elif node.module:
                yield node.module


def test_every_import_respects_the_layers():
    problems = []
    for path in sorted(PKG.rglob("*.py")):
        unit = _unit(path)
        if unit not in LAYER:
            problems.append(f"{path.relative_to(PKG)}: unit {unit!r} has no layer")
            continue
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "otel_agenttape" and len(parts) > 1:
                target = parts[1]
                if target not in LAYER or target == unit:
                    continue
                ok = (LAYER[target] < LAYER[unit] or (unit, target) in ALLOWED
                      or LAYER[unit] == LAYER[target] == TOP)
                if not ok:
                    problems.append(f"{path.relative_to(PKG)} imports {name} (layer {LAYER[target]} from {LAYER[unit]})")
            elif parts[0] in FORBIDDEN_THIRD_PARTY.get(unit, ()):
                problems.append(f"{path.relative_to(PKG)} imports {name}")
    assert not problems, "\n".join(problems)
