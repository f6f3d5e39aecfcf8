"""The default tier keeps its tests: its collected count may grow, never drop by accident.

A test that is removed, renamed into a file pytest does not collect, or marked slow lowers the count; that is a
decision, so it is made here: lower TIER_FLOOR in the same change, and say in the commit which test in the default
tier still covers that boundary. Raise the floor when tests are added, so the next drop is caught too.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.runs import ROOT

TIER_FLOOR = 1050  # tests `pytest` (the default tier: not slow, not gpu) collects


def _collects_the_tier(config: pytest.Config) -> bool:
    """Whether this run collected the default tier as `pytest` alone does: the ini's testpaths and marker expression,
    nothing that narrows the collection (-k, --deselect, --ignore, --lf, stepwise). Its own items are then the count."""
    o = config.option
    addopts = list(config.getini("addopts"))  # split as the ini gives it: ["-m", "not slow and not gpu", ...]
    ini_markexpr = addopts[addopts.index("-m") + 1] if "-m" in addopts else ""
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS and o.markexpr == ini_markexpr
            and not o.keyword and not o.deselect and not o.ignore and not o.ignore_glob
            and not getattr(o, "lf", False) and not getattr(o, "stepwise", False))


def _collected_by_a_child() -> int:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    found = re.search(r"^(\d+)(?:/\d+)? tests? collected", out.stdout, re.M)
    assert found, out.stdout[-3000:]
    return int(found.group(1))


@pytest.mark.integration  # a whole collection in a child (~15 s) unless this run is the tier: not the edit-test loop's
def test_default_tier_collects_at_least_the_floor(request):
    """Counted from this run's own collection when it is the tier (`make test`, CI), else from a child's."""
    collected = len(request.session.items) if _collects_the_tier(request.config) else _collected_by_a_child()
    assert collected >= TIER_FLOOR, (f"the default tier collects {collected} tests, fewer than TIER_FLOOR={TIER_FLOOR}: a test "
                                     "was dropped or marked slow. Restore it, or lower TIER_FLOOR naming the test that covers it")
