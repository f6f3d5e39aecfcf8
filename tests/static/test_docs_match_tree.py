"""The README's layout table and docs/architecture.md match the tree: every package and top-level module of
slime_hydra/ has its row, and no path either names is missing from the tree (a moved or deleted module)."""

from __future__ import annotations

import re

from tests.support.runs import ROOT

PACKAGE = ROOT / "slime_hydra"
TICKED = re.compile(r"`([A-Za-z0-9_./-]+(?:\.py|/))`")


def parts_of_package() -> list[str]:
    """`app/`, `cli.py`, ...: the package's subpackages and top-level modules (`__init__.py` aside)."""
    dirs = [f"{p.name}/" for p in sorted(PACKAGE.iterdir()) if p.is_dir() and (p / "__init__.py").is_file()]
    return dirs + [p.name for p in sorted(PACKAGE.glob("*.py")) if p.name != "__init__.py"]


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start: end if end > 0 else len(text)]


SEARCHED = ("slime_hydra", "tests", "benchmarks", "conf")


def exists(path: str) -> bool:
    """A path as the docs write it: from the repository, from slime_hydra/, or a bare name anywhere in the package,
    the tests or the benchmarks (a table row names its folder first)."""
    name = path.rstrip("/")
    if (ROOT / name).exists() or (PACKAGE / name).exists():
        return True
    return "/" not in name and any(any((ROOT / top).rglob(name)) for top in SEARCHED)


def test_every_package_and_module_has_its_row():
    readme = section((ROOT / "README.md").read_text(), "## Layout")
    floors = section((ROOT / "docs" / "architecture.md").read_text(), "# Architecture")  # up to its first ## section
    for part in parts_of_package():
        assert f"`slime_hydra/{part}" in readme or (part.endswith(".py") and f"`{part}`" in readme), \
            f"README.md's layout table has no row for slime_hydra/{part}"
        assert f"`{part}`" in floors, f"docs/architecture.md's floor table does not place {part}"


def test_no_doc_names_a_path_the_tree_lacks():
    for doc in ("README.md", "docs/architecture.md"):
        text = (ROOT / doc).read_text()
        if doc == "README.md":
            text = section(text, "## Layout")
        missing = sorted({p for p in TICKED.findall(text) if not exists(p)})
        assert missing == [], f"{doc} names paths the tree does not hold: {missing}"
