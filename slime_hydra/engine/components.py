"""What the loop runs on: the run's wiring (`Components`) and what it carries from rollout to rollout (`LoopState`).

Wiring is built once (app/build.py, app/build_ray.py) and typed by the Protocols of
slime_hydra/protocols.py; loop state is what a checkpoint saves and a resume restores (`engine_state`,
`restore`), nothing else.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from slime_hydra.data.buffer import DataBuffer
from slime_hydra.data.dataset import Prompt
from slime_hydra.engine.steps import EvalFunction, EvalSet, LogFunction
from slime_hydra.protocols import PromptSource, RolloutBackend, Scorer, Tracker, TrainBackend
from slime_hydra.training.specs import AdvantageSpec
from slime_hydra.types import SamplingParams


@dataclass
class LoopState:
    start_rollout: int = 0  # the first rollout this run trains (a resumed run: the one after its checkpoint's)
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # (step, metrics) as logged
    ahead: dict[str, Any] = field(default_factory=dict)  # async: the checkpoint's async_ready / async_published_version


@dataclass
class Components:
    tokenizer: Any
    train_prompts: list[Prompt]
    eval_sets: dict[str, EvalSet]
    source: PromptSource
    trainer: TrainBackend
    rollout: RolloutBackend
    scorer: Scorer
    tracker: Tracker
    sampling: SamplingParams
    advantage: AdvantageSpec  # the advantage estimator, built by app/algorithm.py
    output_dir: str = "."
    resumed_from: Optional[Path] = None
    buffer: Optional[DataBuffer] = None  # None: a first-in first-out buffer over `source`
    state: LoopState = field(default_factory=LoopState)
    rollout_dump_meta: dict = field(default_factory=dict)  # the header of save_debug_rollout_data's files
    more_stacks: Optional[Callable[[], str]] = None  # cluster.backend=ray: every actor's stacks, for the stall watchdog
    eval_function: Optional[EvalFunction] = None  # eval.eval_function; None: each eval prompt sampled n times
    rollout_log: Optional[LogFunction] = None  # logger.custom_rollout_log_function
    eval_log: Optional[LogFunction] = None  # logger.custom_eval_rollout_log_function

    def __post_init__(self):
        if self.buffer is None:
            self.buffer = DataBuffer(self.source)


def engine_state(c: Components, rollout_id: int) -> dict:
    """The checkpoint state's content after `rollout_id` (a trainer with its own checkpoint format gives None: <ckpt>/megatron/)."""
    return {"rollout_id": rollout_id, "trainer": c.trainer.state_dict(), "rollout": c.rollout.state_dict(),
            "source": c.source.state_dict(), "buffer": c.buffer.state_dict(), "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(), "history": c.state.history, "tracker_run_id": c.tracker.run_id}


def restore(c: Components, state: dict) -> None:
    c.trainer.load_checkpoint(str(c.resumed_from))  # megatron's own files; a no-op for a trainer whose state is in the state files
    c.trainer.load_state_dict(state["trainer"])  # None for megatron: a no-op there
    c.rollout.load_state_dict(state["rollout"])
    c.source.load_state_dict(state["source"])
    if "buffer" in state:
        c.buffer.load_state_dict(state["buffer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    c.state = LoopState(start_rollout=state["rollout_id"] + 1, history=list(state["history"]),
                        ahead={k: state[k] for k in ("async_ready", "async_published_version") if k in state})
