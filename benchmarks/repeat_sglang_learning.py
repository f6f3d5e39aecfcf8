"""Repeat tests/rollout/sglang/test_backend.py's learning run to measure its spread (so the test's bounds
come from a measured distribution, not from one run).

Each repetition is its own process (fresh engines and router) running the test's fixture config; one JSON line
per run: the held-out accuracy before and after, and the training reward of every rollout.
    .venv/bin/python -m benchmarks.repeat_sglang_learning --reps 10 --out bench_out/sglang_reps.jsonl [overrides]
e.g. `train.lr=1e-12` for the no-learning control (validation refuses lr=0). The summary line per run prints
the held-out rise; the fitted reward rise is `tests.rollout.sglang.test_backend.fitted_rise` of the "reward" list.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

ONE = r"""
import json, sys, time
from tests.rollout.sglang.test_backend import EXPERIMENT, RUN, NUM_ROLLOUT, FIXTURE, rewards_of, eval_of, fitted_rise
from slime_hydra.app.build import build
from slime_hydra.app.preflight import compose_run
from slime_hydra.app.session import loop_settings
from slime_hydra.engine import loop
out = sys.argv[1]
cfg = compose_run([EXPERIMENT, *RUN, f"num_rollout={NUM_ROLLOUT}", *FIXTURE, *sys.argv[2:]])
t0 = time.time()
c = build(cfg, out)
try:
    h = loop.run(loop_settings(cfg), c, out + "/ckpt")
finally:
    c.rollout.shutdown()
print("RESULT " + json.dumps({"eval": eval_of(h), "reward": rewards_of(h), "reward_fitted_rise": fitted_rise(rewards_of(h)),
                              "wall_s": time.time() - t0}))
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default="bench_out/sglang_reps.jsonl")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    for i in range(a.reps):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.time()
            r = subprocess.run([sys.executable, "-c", ONE, d, *a.overrides], capture_output=True, text=True,
                               timeout=1800)
            lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
            if not lines:
                print(f"rep {i}: failed (exit {r.returncode})\n{r.stderr[-3000:]}", file=sys.stderr)
                continue
            res = json.loads(lines[-1][7:])
            res["overrides"] = a.overrides
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")
            (s0, e0), (s1, e1) = res["eval"]
            print(f"rep {i}: eval {e0:.3f} -> {e1:.3f} ({e1 - e0:+.3f}), reward fitted rise {res['reward_fitted_rise']:+.4f}, "
                  f"{time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
