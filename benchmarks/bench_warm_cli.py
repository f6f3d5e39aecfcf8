"""A test's CLI run cold (`python -m slime_hydra`, a fresh interpreter) against warm (a fork of an interpreter that has
imported the stack: tests/support/warm_cli.py, what the test tier's run_cli and start_cli use).

Each round runs the same short run of the embedded default both ways, alternating (FAST, 2 rollouts, no tracker), and
one bad override (exit 2 before any model). The warm side's forkserver is started and has finished its imports before
the first round, so its one-off cost (printed) is not in the rounds. Figures: the median wall seconds of `--rounds`
and the ratio warm / cold from the same run. Nothing else should run on the machine meanwhile.

Run: .venv/bin/python -m benchmarks.bench_warm_cli [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds

    from tests.support import warm_cli
    from tests.support.runs import FAST, cli_env

    env = cli_env()
    warm_cli.SESSION_ENV.update(env)
    cases = {"short run": [*FAST, "num_rollout=2", "logger=none"], "bad override": ["train.lr=-1"]}
    with tempfile.TemporaryDirectory(prefix="bench_warm_cli_") as tmp:
        t0 = time.perf_counter()
        warm_cli.run("slime_hydra", ["--help"], Path(tmp), env, 600)  # the forkserver starts and imports
        print(f"forkserver start and imports, then one --help: {time.perf_counter() - t0:.1f} s (once per test worker)")
        for name, args in cases.items():
            times: dict[str, list[float]] = {"cold": [], "warm": []}
            for r in range(rounds):
                for kind in ("cold", "warm"):
                    out = Path(tmp) / f"{name.replace(' ', '_')}_{kind}_{r}"
                    out.mkdir()
                    full = [*args, f"hydra.run.dir={out}/run"]
                    t = time.perf_counter()
                    if kind == "cold":
                        proc = subprocess.run([sys.executable, "-m", "slime_hydra", *full], cwd=out, env=env,
                                              capture_output=True, text=True, timeout=600)
                    else:
                        proc = warm_cli.run("slime_hydra", full, out, env, 600)
                    times[kind].append(time.perf_counter() - t)
                    want = 0 if name == "short run" else 2
                    assert proc.returncode == want, (kind, proc.returncode, proc.stderr[-2000:])
            cold, warm = statistics.median(times["cold"]), statistics.median(times["warm"])
            print(f"{name}: cold {cold:.2f} s, warm {warm:.2f} s (median of {rounds}); warm / cold = {warm / cold:.2f}")


if __name__ == "__main__":
    main()
