"""Checks of slime's debug split: load_debug_rollout_data / debug_train_only and debug_rollout_only.

Only the keys and whether the dump's files exist; what the dump holds (its model, its rollouts) is checked where
the run is built, against the tokenizer, before any model loads (slime_hydra/data/rollout_dump.py). Which cluster
backend runs them is checked beside the cluster backends (orchestration/checks.py).
"""

from __future__ import annotations

import glob
from pathlib import Path

from slime_hydra.config.schema import RunConfig


def check_debug(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    load, w = cfg.load_debug_rollout_data, cfg.warmstart
    if cfg.debug_train_only and not load:  # (derivation turns it on when a dump is loaded)
        problems.append("debug_train_only=true trains on saved rollouts and builds no rollout engine; set "
                        "load_debug_rollout_data=<dir or glob of dumps written by save_debug_rollout_data>")
    if load and cfg.debug_rollout_only:
        problems.append("load_debug_rollout_data (train only) and debug_rollout_only=true (generate only) exclude each "
                        "other; unset one")
    if load:
        p = Path(load)
        if not (p.is_dir() and any(p.glob("*.jsonl"))) and not any(Path(f).is_file() for f in glob.glob(load, recursive=True)):
            problems.append(f"load_debug_rollout_data={load}: no dump files match (a directory of rollout_NNNNNN.jsonl "
                            "written by save_debug_rollout_data, or a glob of such files)")
        if w.steps and w.target_train_accuracy is not None:
            problems.append("warmstart.target_train_accuracy checks the warm start by generating, and a train-only replay "
                            "has no rollout engine; set warmstart.steps=0 if the dumped run had no warm start, else "
                            "warmstart.target_train_accuracy=null warmstart.min_steps=0 warmstart.steps=<its warmstart/steps "
                            "metric>")
        if cfg.eval.eval_prompt_data:
            notes.append("load_debug_rollout_data: no rollout engine, so no eval (eval.eval_prompt_data is not run)")
    if cfg.debug_rollout_only:
        if w.steps:
            problems.append(f"debug_rollout_only=true builds no trainer, so no warm start (warmstart.steps={w.steps}); "
                            "set warmstart.steps=0")
        if not cfg.save_debug_rollout_data:
            notes.append("debug_rollout_only without save_debug_rollout_data: rollouts are generated and scored, not "
                         "saved; set save_debug_rollout_data=<dir> to keep them")
