"""A deterministic learning test's run over other seeds: how far its figure moves when only the rounding path changes.

A run on one process with a fixed seed gives the same figures at every repetition on one machine, and other figures on
a CPU whose kernels round differently (AVX2 against AVX-512 BLAS): repeating it measures nothing, so its bound comes
from the same run over seeds instead, each seed another path through the same training.

    .venv/bin/python -m benchmarks.learning_seed_spread --seeds 1-10 --jobs 2 megatron_ppo_cli

Each run is the test's own CLI run (its arguments imported from the test module) with `seed=N`, `--jobs` at a time;
it prints the held-out accuracy's first and last value per seed and the spread of the rise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the tier sets it (tests/conftest.py): runs side by side share the cores


def runs() -> dict[str, tuple[str, list[str]]]:
    """name -> (module the CLI runs as, the test's arguments)."""
    from tests.training.megatron.test_critic import PPO_CLI

    return {"megatron_ppo_cli": ("tests.support.megatron_cpu.cli", PPO_CLI)}


def seeds_of(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def run_seed(module: str, args: list[str], seed: int, timeout: int) -> dict:
    from tests.support.runs import cli_env

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", module, *args, f"seed={seed}", f"hydra.run.dir={tmp}/run"], cwd=tmp,
                           env=cli_env(), capture_output=True, text=True, timeout=timeout)
        row = {"seed": seed, "rc": r.returncode, "wall_s": round(time.monotonic() - t0, 1)}
        if r.returncode != 0:
            return row | {"tail": r.stderr[-1500:]}
        acc = json.loads((Path(tmp) / "run" / "summary.json").read_text())["eval/addition/accuracy"]
        return row | {"eval_first": acc["first"], "eval_last": acc["last"], "eval_rise": round(acc["last"] - acc["first"], 4)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run", choices=sorted(runs()))
    p.add_argument("--seeds", default="1-10", help="a range, 1-10, or one seed")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=1800)
    a = p.parse_args()
    module, args = runs()[a.run]
    def one(seed: int) -> dict:
        row = run_seed(module, args, seed, a.timeout)
        print(json.dumps(row), flush=True)
        return row

    with ThreadPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(one, seeds_of(a.seeds)))
    rises = [r["eval_rise"] for r in rows if "eval_rise" in r]
    if rises:
        print(f"{a.run}: eval_rise over {len(rises)} seeds: min {min(rises):.3f} median {statistics.median(rises):.3f} "
              f"max {max(rises):.3f}; {len(rows) - len(rises)} run(s) failed")


if __name__ == "__main__":
    main()
