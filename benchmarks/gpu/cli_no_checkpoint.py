"""`python3 benchmarks/gpu/cli_no_checkpoint.py METRICS.jsonl ARGS`: the slime-hydra CLI with ARGS (run with
logger=none), minus its checkpoints, plus every step's metrics written as one JSON line to METRICS.jsonl.

For GPU figures of models whose checkpoint the machine cannot afford: the loop always saves the last rollout, and a
bf16 megatron checkpoint holds the fp32 main parameters and Adam's moments, 14 bytes a parameter (the reduced
Qwen3-30B-A3B of benchmarks/gpu/moe_bf16.sh: about 44 GB, most of the device machine's disk). Without a checkpoint
the per-step history lives only in the tracker, so the no-op tracker of logger=none writes it here instead.
"""

from __future__ import annotations

import json
import sys

from slime_hydra.engine import loop
from slime_hydra.tracking import base


def _no_save(c, save_dir, rollout_id, feed) -> None:
    print(f"checkpoint of rollout {rollout_id} not written (benchmarks/gpu/cli_no_checkpoint.py)", flush=True)


def main() -> None:
    path, sys.argv = sys.argv[1], [sys.argv[0], *sys.argv[2:]]
    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run

    def log_metrics(self, metrics, step) -> None:
        out.write(json.dumps({"step": step, **{k: float(v) if isinstance(v, (int, float)) else str(v) for k, v in metrics.items()}}) + "\n")
        out.flush()

    loop.save = _no_save
    base.NullTracker.log_metrics = log_metrics
    from slime_hydra.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
