"""What the loop runs on: the built parts of one run, whichever builder (local or Ray) made them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from slime_hydra.data.buffer import DataBuffer
from slime_hydra.data.dataset import Prompt
from slime_hydra.data.source import PromptSource
from slime_hydra.engine.steps import EvalSet
from slime_hydra.rewards.compute import RewardScorer
from slime_hydra.rollout.base import RolloutBackend
from slime_hydra.tracking.base import Tracker
from slime_hydra.training.base import TrainBackend
from slime_hydra.training.specs import AdvantageSpec
from slime_hydra.types import SamplingParams


@dataclass
class Components:
    tokenizer: object
    train_prompts: list[Prompt]
    eval_sets: dict[str, EvalSet]
    source: PromptSource
    trainer: TrainBackend
    rollout: RolloutBackend
    scorer: RewardScorer
    tracker: Tracker
    sampling: SamplingParams
    advantage: AdvantageSpec  # the advantage estimator, built by app/algorithm.py
    output_dir: str = "."
    start_rollout: int = 0
    history: list = field(default_factory=list)
    resumed_from: Optional[Path] = None
    buffer: Optional[DataBuffer] = None  # None: a first-in first-out buffer over `source`
    ready: dict = field(default_factory=dict)  # async: finished rollouts restored from a checkpoint, trained first

    def __post_init__(self):
        if self.buffer is None:
            self.buffer = DataBuffer(self.source)
