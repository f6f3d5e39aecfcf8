"""The product speaks of itself: no comment, message, doc or file name says which issue or session produced it.

A line says what and why ("the SGLang engines must share the driver's node"), not "(issue NN: ...)"; a benchmark is
named for what it measures (`benchmarks/gpu/length_mix.sh`, not `issueNN_mix.sh`). Read as text with the standard
library only, so it runs in well under a second. tests/static/ is left out: this file has to spell the pattern.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("slime_hydra", "docs", "benchmarks", "experiments", "tests")
SKIPPED = (ROOT / "tests" / "static",)
SUFFIXES = {".py", ".md", ".yaml", ".sh"}
TICKET = re.compile(r"issue ?#?[0-9]|session [0-9]", re.IGNORECASE)
TICKET_IN_NAME = re.compile(r"issue[-_ ]?[0-9]", re.IGNORECASE)


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and not any(path.is_relative_to(s) for s in SKIPPED):
                files.append(path)
    return files


def test_no_text_names_an_issue_or_a_session():
    hits = []
    for path in scanned_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if TICKET.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, ("say what and why instead of which issue or session produced it:\n"
                      + "\n".join(hits))


def test_the_scan_covers_the_tree():
    names = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert "README.md" in names and "docs/gpu_results.md" in names and "slime_hydra/cli.py" in names
    assert not any(n.startswith("tests/static/") for n in names)


def test_no_benchmark_is_named_after_an_issue():
    named = [p.relative_to(ROOT).as_posix() for p in (ROOT / "benchmarks").rglob("*") if TICKET_IN_NAME.search(p.name)]
    assert not named, f"name these for what they measure: {named}"
