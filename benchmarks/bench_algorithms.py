"""Every `algorithm=` option trains the embedded task from one warm start: final accuracy and wall time.

Each option runs `--steps` rollouts of the embedded default (32 prompts × 8, lr from the experiment,
held constant so no option gains from a schedule tuned for another) from the same SFT warm-started
checkpoint; the final model is scored by slime_hydra's greedy held-out eval. One seed per option:
differences of a few points are noise. Left out: per-option tuning (every option runs the
experiment's lr and its own clip defaults).

Run: HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.bench_algorithms --steps 150 [--options ppo grpo]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.bench_grpo_vs_trl import NUM_THREADS, compose, heldout_accuracy, warm_started_checkpoint
from slime_hydra.config.store import CONF_DIR

OPTIONS = sorted(p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml"))


def train_option(option: str, ckpt: str, steps: int, out: Path) -> dict:
    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine.loop import run

    cfg = compose([f"algorithm={option}", f"model.hf_checkpoint={ckpt}", "warmstart=none", f"num_rollout={steps}",
                   "eval=none"])
    c = build(cfg, str(out))
    t0 = time.perf_counter()
    history = run(loop_settings(cfg), c, str(out / "checkpoints"))
    wall = time.perf_counter() - t0
    steps_s = [m["perf/step_time_s"] for _, m in history if "perf/step_time_s" in m]
    return {"option": option, "wall_s": wall, "median_step_s": statistics.median(steps_s),
            "heldout_accuracy": heldout_accuracy(c.trainer.model, ckpt)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default="bench_out/algorithms.json")
    ap.add_argument("--options", nargs="*", default=OPTIONS, choices=OPTIONS, help="a subset of the algorithm= options")
    args = ap.parse_args()
    torch.set_num_threads(NUM_THREADS)
    with tempfile.TemporaryDirectory(prefix="bench_alg_") as tmp:
        tmp = Path(tmp)
        ckpt = warm_started_checkpoint(tmp)
        start = heldout_accuracy(compose_model(ckpt), ckpt)
        rows = [train_option(o, ckpt, args.steps, tmp / o) for o in args.options]
    print(f"\nwarm start held-out accuracy: {start:.3f}; {args.steps} rollouts per option\n")
    print(f"{'algorithm':<30}{'held-out acc':>14}{'wall s':>10}{'median step s':>15}")
    for r in rows:
        print(f"{r['option']:<30}{r['heldout_accuracy']:>14.3f}{r['wall_s']:>10.1f}{r['median_step_s']:>15.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"start_accuracy": start, "steps": args.steps, "rows": rows}, indent=2))


def compose_model(ckpt: str):
    from benchmarks.bench_grpo_vs_trl import load_checkpoint

    return load_checkpoint(ckpt)[0]


if __name__ == "__main__":
    main()
