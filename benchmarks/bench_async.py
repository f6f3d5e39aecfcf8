"""train_mode=sync vs train_mode=async on the embedded default: per-rollout wall time and held-out accuracy.

One run per (seed, mode), each from its own warm start (the seed sets the init, so starts differ by seed,
not by mode). Measured: the median `perf/step_time_s` (wait for the rollout + advantages + train + weight
sync) and the greedy held-out accuracy after the warm start and at the end. Left out: the warm start and
eval time (outside the step timer).

Run: HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.bench_async --seeds 1 2 --num-rollout 150
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run_one(seed: int, mode: str, num_rollout: int) -> dict:
    from slime_hydra.app.build import build
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    cfg = compose_run(["logger=none", "logger.progress_bar=false", f"num_rollout={num_rollout}", f"seed={seed}",
                       f"train_mode={mode}", f"eval.eval_interval={num_rollout}"])
    with tempfile.TemporaryDirectory(prefix="bench_async_") as tmp:
        c = build(cfg, tmp)
        try:
            history = loop.run(loop_settings(cfg), c, os.path.join(tmp, "checkpoints"))
        finally:
            c.tracker.close("FINISHED")
            c.rollout.shutdown()
    steps = [m["perf/step_time_s"] for _, m in history if "perf/step_time_s" in m]
    acc = [m["eval/addition/accuracy"] for _, m in history if "eval/addition/accuracy" in m]
    return {"median_step_s": statistics.median(steps), "acc_start": acc[0], "acc_end": acc[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--num-rollout", type=int, default=150)
    args = ap.parse_args()
    print(f"{'seed':>5} {'mode':>6} {'median s/rollout':>17} {'acc start':>10} {'acc end':>8}")
    for seed in args.seeds:
        res = {mode: run_one(seed, mode, args.num_rollout) for mode in ("sync", "async")}
        for mode, r in res.items():
            print(f"{seed:>5} {mode:>6} {r['median_step_s']:>17.4f} {r['acc_start']:>10.3f} {r['acc_end']:>8.3f}", flush=True)
        print(f"seed {seed}: async/sync wall per rollout {res['async']['median_step_s'] / res['sync']['median_step_s']:.3f}")


if __name__ == "__main__":
    main()
