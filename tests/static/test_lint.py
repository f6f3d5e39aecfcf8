"""Lint in the default tier: ruff with the project's configuration (pyproject.toml [tool.ruff]: pyflakes' unused and
undefined names, sorted imports). The import direction has its own test (test_import_direction.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_package_its_tests_and_benchmarks_are_clean():
    r = ruff("slime_hydra", "tests", "benchmarks")
    assert r.returncode == 0, f"ruff found problems (fix them, or `ruff check --fix` for import order):\n{r.stdout[-4000:]}"


def test_the_configuration_catches_an_unused_import_and_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    r = ruff(str(bad))
    assert r.returncode == 1 and "F401" in r.stdout and "F821" in r.stdout, r.stdout
