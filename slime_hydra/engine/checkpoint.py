"""Atomic checkpoints: HF weights (loadable by `from_pretrained`) plus the exact state to resume.

Layout: <save>/rollout_000010/{model.safetensors, config.json, tokenizer.json, ..., state.pt}
and <save>/latest naming the newest one. A DistCheckpointing trainer (train.backend=megatron) adds its
own `megatron/` directory (model, optimizer, reference in megatron's distributed format) and keeps its
state out of state.pt. A checkpoint is written into a hidden temporary
directory and renamed into place, and `latest` is replaced atomically, so a crash mid-save leaves
the previous checkpoint intact.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch


def checkpoint_name(rollout_id: int) -> str:
    return f"rollout_{rollout_id:06d}"


def trainer_files(trainer, tokenizer):
    """The `write_hf` of save_checkpoint: HF weights + tokenizer, and the trainer's own checkpoint if it has one."""
    from slime_hydra.training.base import DistCheckpointing

    def write(path: str) -> None:
        trainer.save_hf(path, tokenizer)
        if isinstance(trainer, DistCheckpointing):
            trainer.save_checkpoint(path)

    return write


def save_checkpoint(save_dir: str, rollout_id: int, write_hf, state: dict[str, Any]) -> Path:
    root = Path(save_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(rollout_id)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        write_hf(str(tmp))
        torch.save(state, tmp / "state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name + "\n")
    os.replace(latest_tmp, root / "latest")
    return final


def resolve_checkpoint(load: str) -> Path:
    """`load` may be a checkpoint directory or the save root holding `latest`."""
    p = Path(load)
    if (p / "state.pt").is_file():
        return p
    if (p / "latest").is_file():
        return p / (p / "latest").read_text().strip()
    from slime_hydra.errors import UserError

    raise UserError(f"load={load}: neither a checkpoint (no state.pt) nor a save directory (no 'latest' file)")


def load_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(ckpt / "state.pt", weights_only=False)
