"""The machine's CPU spent by each test of the tier, run one test at a time: which tests the tier's minutes go to.

    .venv/bin/python -m benchmarks.tier_cpu_by_test [--out bench_out/tier_cpu_by_test.jsonl] [-- PYTEST ARGS ...]

The tier keeps both cores of a two-core machine busy from start to end (benchmarks/tier_cpu_profile.py), so its wall
time under xdist is about its CPU-seconds over two, and a test's own wall time there says little: it waits for a core
behind the other worker's test. This runs pytest serially (no xdist) with itself as a plugin, and charges each test the
machine-wide busy time (/proc/stat: every process, the servers and Ray workers it drives included) from its setup to
its teardown. A session-scoped server is charged to the first test that asks for it; a module fixture to its module's
first test. Anything else running on the machine is charged too: run it on a quiet machine.

Default pytest arguments: the tier's selection less the unit layer (`-m "not slow and not gpu and integration"`), where
nearly all of the tier's CPU is; pass your own after `--` (for example `tests/` for everything).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HZ = os.sysconf("SC_CLK_TCK")
OUT_ENV = "TIER_CPU_BY_TEST_OUT"


def busy_seconds() -> float:
    """CPU-seconds the whole machine has spent busy since boot (user, nice, system, irq, softirq, steal)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / HZ  # less idle and iowait


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu0, t0 = busy_seconds(), time.monotonic()
    yield
    row = {"test": item.nodeid, "wall_s": round(time.monotonic() - t0, 2), "cpu_s": round(busy_seconds() - cpu0, 2)}
    with open(os.environ[OUT_ENV], "a") as f:
        f.write(json.dumps(row) + "\n")


def table(rows: list[dict], top: int) -> str:
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        m = modules[r["test"].split("::")[0]]
        m[0], m[1], m[2] = m[0] + r["cpu_s"], m[1] + r["wall_s"], m[2] + 1
    cpu = sum(r["cpu_s"] for r in rows)
    lines = [f"{len(rows)} tests, {cpu:.0f} CPU-s, {sum(r['wall_s'] for r in rows):.0f} s wall (serial)", "",
             f"by module (top {top}): CPU-s, share, wall s, tests"]
    for name, (c, w, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{c:8.1f} {c / cpu:6.1%} {w:8.1f} {n:4d}  {name}")
    lines += ["", f"by test (top {top}): CPU-s, wall s"]
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        lines.append(f"{r['cpu_s']:8.1f} {r['wall_s']:8.1f}  {r['test']}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/tier_cpu_by_test.jsonl")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--report", action="store_true", help="print the table of an earlier --out, run nothing")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    out = Path(a.out)
    if not a.report:
        args = a.pytest_args[1:] if a.pytest_args[:1] == ["--"] else a.pytest_args
        args = args or ["-m", "not slow and not gpu and integration"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        env = {**os.environ, OUT_ENV: str(out.resolve())}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as make runs the tier: with bytecode
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.tier_cpu_by_test", *args],
                             env=env)  # no -n: one test at a time
        if rc not in (0, 1):
            sys.exit(rc)
    print(table([json.loads(line) for line in out.read_text().splitlines()], a.top))


if __name__ == "__main__":
    main()
