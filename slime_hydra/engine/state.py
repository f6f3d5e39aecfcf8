"""The engine's resumable state: what a checkpoint's state.pt holds, and how a build puts it back."""

from __future__ import annotations

import random

import torch

from slime_hydra.engine.components import Components
from slime_hydra.training.base import DistCheckpointing


def engine_state(c: Components, rollout_id: int) -> dict:
    trainer = None if isinstance(c.trainer, DistCheckpointing) else c.trainer.state_dict()  # megatron: <ckpt>/megatron/
    return {"rollout_id": rollout_id, "trainer": trainer, "rollout": c.rollout.state_dict(),
            "source": c.source.state_dict(), "buffer": c.buffer.state_dict(), "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
            "history": c.history, "tracker_run_id": c.tracker.run_id}


def restore(c: Components, state: dict) -> None:
    if isinstance(c.trainer, DistCheckpointing):
        c.trainer.load_checkpoint(str(c.resumed_from))
    else:
        c.trainer.load_state_dict(state["trainer"])
    c.rollout.load_state_dict(state["rollout"])
    c.source.load_state_dict(state["source"])
    if "buffer" in state:
        c.buffer.load_state_dict(state["buffer"])
    c.ready = {k: state[k] for k in ("async_ready", "async_published_version") if k in state}
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    c.history = list(state["history"])
    c.start_rollout = state["rollout_id"] + 1
