"""The package's imports point down the floors and never run in a circle.

Read from the source with `ast` (nothing is imported), function-level and TYPE_CHECKING imports
included: an import inside a function still ties the two modules. The floors, top first:

    cli -> app -> engine, orchestration -> training, rollout, agent
        -> algorithms, rewards, data, models, tracking -> config, types, errors, aio, runtime, ports

An import may point down any number of floors or stay on its floor; one pointing up, or any
circle of modules, fails with the file, the line and the two floors. A new top-level module or
package must be given a floor here first (docs/architecture.md says which).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "slime_hydra"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

FLOORS: list[tuple[str, ...]] = [  # top first
    ("__main__", "cli"),
    ("app",),
    ("engine", "orchestration"),
    ("training", "rollout", "agent"),
    ("algorithms", "rewards", "data", "models", "tracking"),
    ("config", "types", "protocols", "errors", "aio", "runtime", "ports", "__init__"),
]
HEIGHT = {part: len(FLOORS) - i for i, parts in enumerate(FLOORS) for part in parts}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that `name` starts with (`a.b.C` -> `a.b` when C is a class)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported package module, line) for every import in the file, wherever it stands."""
    is_pkg = path.name == "__init__.py"
    out: dict[tuple[str, int], None] = {}  # ordered, one entry per (module, line)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import mod` imports the submodule; `from mod import name` the module
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
        for t in targets:
            if t == PACKAGE or t.startswith(PACKAGE + "."):
                resolved = _resolve(t, known)
                if resolved and resolved != module:
                    out[(resolved, node.lineno)] = None
    return list(out)


def floor_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph(root: Path = ROOT) -> tuple[dict[str, Path], dict[str, list[tuple[str, int]]]]:
    known = modules(root)
    return known, {m: imports(m, p, known) for m, p in known.items()}


def upward(root: Path = ROOT) -> list[str]:
    known, edges = graph(root)
    out = []
    for m, targets in edges.items():
        for t, line in targets:
            a, b = floor_of(m), floor_of(t)
            if HEIGHT[b] > HEIGHT[a]:
                out.append(f"{known[m].relative_to(root.parent)}:{line}: {m} ({a}, floor {HEIGHT[a]}) imports {t} "
                           f"({b}, floor {HEIGHT[b]}), a higher floor")
    return out


def circles(root: Path = ROOT) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    _, edges = graph(root)
    succ = {m: sorted({t for t, _ in ts}) for m, ts in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the package's ~150 modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_floor():
    unplaced = sorted({floor_of(m) for m in modules()} - set(HEIGHT))
    assert not unplaced, f"give these a floor in FLOORS (and docs/architecture.md): {unplaced}"


def test_no_import_points_up():
    found = upward()
    assert not found, "imports pointing up a floor:\n" + "\n".join(found)


def test_no_import_circles():
    found = circles()
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_reader_sees_function_level_and_relative_imports(tmp_path):
    """The checker itself: an upward import hidden in a function, written relatively, is found."""
    pkg = tmp_path / PACKAGE
    for sub in ("config", "engine"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "loop.py").write_text("from slime_hydra.config import low\n")
    (pkg / "config" / "low.py").write_text("def f():\n    from ..engine import loop\n    return loop\n")
    found = upward(pkg)
    assert len(found) == 1 and "slime_hydra/config/low.py:2:" in found[0] and "slime_hydra.engine.loop" in found[0]
    assert circles(pkg) == [["slime_hydra.config.low", "slime_hydra.engine.loop"]]
