"""slime's debug split, at build time: which dump a train-only replay reads, and which checkpoints a run may resume.

The loop never asks which mode it runs in; app/build.py picks the components: a replay gets ReplayRollout and
ReplayBuffer (rollout/replay.py, data/rollout_dump.py) and a real trainer; rollout-only gets the real rollout
backend behind NoWeightSync and NoTrain (training/noop.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from slime_hydra.config.schema import RunConfig
from slime_hydra.data.rollout_dump import RolloutDump, check_dump, dump_meta, read_dump
from slime_hydra.engine.checkpoint import CheckpointError
from slime_hydra.errors import ConfigError
from slime_hydra.training.noop import MARKER


def rollout_dump_meta(cfg: RunConfig, tokenizer) -> dict:
    return dump_meta(cfg.model.name, cfg.model.hf_checkpoint, tokenizer, cfg.rollout.n_samples_per_prompt)


def open_replay(cfg: RunConfig, tokenizer, state: Optional[dict]) -> Optional[RolloutDump]:
    """load_debug_rollout_data's headers, checked against this run (exit 2 naming the key); None without it."""
    if not cfg.load_debug_rollout_data:
        return None
    dump, problems = read_dump(cfg.load_debug_rollout_data)
    start = state["rollout_id"] + 1 if state else 0
    if dump is not None:
        problems = check_dump(dump, rollout_dump_meta(cfg, tokenizer), start, cfg.num_rollout, cfg.rollout.rollout_batch_size)
    if problems:
        raise ConfigError(problems)
    return dump


def is_rollout_only(state: Optional[dict]) -> bool:
    """A checkpoint written by debug_rollout_only: no weights, no trainer state."""
    return state is not None and state.get("trainer") == MARKER


def check_resume(cfg: RunConfig, resume: Optional[Path], state: Optional[dict]) -> None:
    if is_rollout_only(state) and not cfg.debug_rollout_only:
        raise CheckpointError(f"load={cfg.load}: {resume} was written by debug_rollout_only=true and holds no trained "
                              "weights or trainer state; resume it with debug_rollout_only=true, or train on its rollouts "
                              "with load_debug_rollout_data=<its save_debug_rollout_data> (without load)")
