"""Run the default tier's learning tests again and again, optionally beside a concurrent `make run` (a loaded
machine), and record what each run measured: the spread the tests' bounds are set from, and whether any run failed.

    .venv/bin/python -m benchmarks.repeat_learning_tests --reps 10 --load --out bench_out/learning_reps.jsonl [NODEID ...]

Each repetition is its own pytest process (`-n 0 -s`), so module fixtures (engines, CLI runs) start fresh. A learning
test prints its figures as `LEARNING {json}` (tests/support/learning.py); one JSON line per repetition and test goes
to --out, and the summary gives, per test and figure, the minimum, median and maximum over the repetitions, the
passes, and the test's bound beside the worst value seen (a bound must sit below the worst). With --load, the
embedded default (`slime-hydra`, as `make run` starts it) runs in a loop in its own process group for the whole
measurement and is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the default tier's tests whose assertion is a learning bound; the figure each bound reads, and the bound
LEARNING_TESTS = {
    "tests/e2e/test_default_run.py::test_short_run_raises_reward_and_accuracy": {"eval_rise": 0.1},
    "tests/training/megatron/test_critic.py::test_cli_ppo_run_with_megatron_backend_raises_accuracy": {"eval_rise": 0.0},
    "tests/rollout/sglang/test_backend.py::test_grpo_through_sglang_learns_like_local": {"eval_rise": 0.0,
                                                                                        "reward_fitted_rise": 0.03},
    "tests/training/test_ppo.py::test_critic_learns_its_returns_and_first_step_metrics": {"value_loss_ratio": 0.25},
    "tests/training/megatron/test_moe_experiment.py::test_tiny_moe_experiment_learns_with_expert_parallelism_under_ray":
        {"eval_rise": 0.1},
}


def load_loop(work: Path) -> subprocess.Popen:
    """The embedded default, restarted whenever it ends, in its own process group (what `make run` starts)."""
    script = f"while true; do {ROOT}/.venv/bin/slime-hydra hydra.run.dir={work}/run logger=none >/dev/null 2>&1; done"
    return subprocess.Popen(["bash", "-c", script], cwd=work, start_new_session=True)


def run_once(nodeid: str, timeout: int) -> dict:
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-n", "0", "-p", "no:cacheprovider", nodeid],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = str(e.stdout or ""), -1
    figures = {}
    for line in out.splitlines():
        if line.startswith("LEARNING "):
            figures.update({k: v for k, v in json.loads(line[9:]).items() if k != "test"})
    return {"test": nodeid, "passed": rc == 0, "rc": rc, "wall_s": round(time.monotonic() - t0, 1), **figures,
            **({} if rc == 0 else {"tail": out[-2000:]})}


def summarize(rows: list[dict]) -> None:
    for test in dict.fromkeys(r["test"] for r in rows):
        mine = [r for r in rows if r["test"] == test]
        print(f"{test}: {sum(r['passed'] for r in mine)}/{len(mine)} passed, wall {min(r['wall_s'] for r in mine):.0f}-"
              f"{max(r['wall_s'] for r in mine):.0f} s")
        bounds = LEARNING_TESTS.get(test, {})
        for k in sorted({k for r in mine for k in r} - {"test", "passed", "rc", "wall_s", "tail"}):
            v = [r[k] for r in mine if isinstance(r.get(k), (int, float))]
            if v:
                bound = f", bound {bounds[k]}" if k in bounds else ""
                print(f"  {k}: min {min(v):.4f} median {statistics.median(v):.4f} max {max(v):.4f} (n={len(v)}){bound}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--load", action="store_true", help="run the embedded default beside the tests for the whole time")
    p.add_argument("--out", default="bench_out/learning_reps.jsonl")
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--summary", action="store_true", help="only summarize --out")
    p.add_argument("tests", nargs="*", default=list(LEARNING_TESTS))
    a = p.parse_args()
    out = Path(a.out)
    if a.summary:
        summarize([json.loads(line) for line in out.read_text().splitlines()])
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    load = None
    with tempfile.TemporaryDirectory() as work:
        if a.load:
            load = load_loop(Path(work))
        rows = []
        try:
            for test in a.tests:
                for i in range(a.reps):
                    row = run_once(test, a.timeout) | {"rep": i, "load": a.load}
                    rows.append(row)
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"{test} rep {i}: {'passed' if row['passed'] else 'FAILED'} in {row['wall_s']} s "
                          f"{ {k: v for k, v in row.items() if k not in ('test', 'passed', 'rc', 'wall_s', 'tail', 'rep', 'load')} }",
                          flush=True)
        finally:
            if load is not None:
                os.killpg(load.pid, signal.SIGKILL)
                load.wait()
    summarize(rows)


if __name__ == "__main__":
    main()
