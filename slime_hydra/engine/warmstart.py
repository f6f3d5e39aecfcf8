"""Supervised warm start (slime's loss_type=sft_loss): teach the answer format before RL.

Targets are `label + eos` after the prompt; only those tokens train. The SFT dial is steep (held-out accuracy
can move 0.1 in 10 steps) and where a fixed step count lands moves with the seed, so `target_train_accuracy`
stops it by a measurement instead: greedy accuracy on a fixed sample of training prompts, never the eval data.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from slime_hydra.data.dataset import Prompt
from slime_hydra.engine.components import Components
from slime_hydra.engine.offload import trainer_released
from slime_hydra.engine.steps import EvalSet, evaluate
from slime_hydra.protocols import RolloutBackend, Scorer, TrainBackend
from slime_hydra.training.batch import collate
from slime_hydra.types import Sample, SamplingParams


def sft_samples(prompts: list[Prompt], tokenizer) -> list[Sample]:
    out = []
    for p in prompts:
        target = tokenizer(p.label, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append(Sample(prompt=p.prompt, label=p.label, prompt_tokens=p.tokens, tokens=p.tokens + target,
                          response_length=len(target), loss_mask=[1] * len(target)))
    return out


@dataclass(frozen=True)
class WarmStart:
    """The warm start the engine runs (warmstart.*, built by the composition floor: app/session.py), its SFT-samples
    plug-in already an object. With `target_train_accuracy`, greedy accuracy on `check_prompts` training prompts is
    checked every `check_interval` steps from `min_steps` on, and the first that reaches it stops the warm start."""

    steps: int
    batch_size: int
    lr: float
    seed: int
    custom_sft_samples: Optional[Callable[..., list[Sample]]]  # fn(prompts, tokenizer) -> samples; None: label + eos
    target_train_accuracy: Optional[float]
    check_prompts: int
    check_interval: int
    min_steps: int


@dataclass
class WarmStartResult:
    losses: list[float]  # one per step taken
    train_accuracy: Optional[float] = None  # the last check's (None: no checks)

    @property
    def steps(self) -> int:
        return len(self.losses)


def warm_start(trainer: TrainBackend, prompts: list[Prompt], tokenizer, steps: int, batch_size: int, lr: float,
               seed: int, custom_sft_samples: Optional[Callable[..., list[Sample]]] = None,
               check: Optional[Callable[[], float]] = None, check_interval: int = 1,
               target: Optional[float] = None, min_steps: int = 0) -> WarmStartResult:
    """At most `steps` SFT steps; with `target`, stop at the first check (every `check_interval` steps, from
    `min_steps` on) whose `check()` (e.g. greedy training accuracy) reaches it.
    custom_sft_samples (warmstart.custom_sft_samples): fn(prompts, tokenizer) -> samples with their own loss masks."""
    samples = (custom_sft_samples or sft_samples)(prompts, tokenizer)
    rng = random.Random(seed)
    out = WarmStartResult([])
    for step in range(1, steps + 1):
        batch = rng.sample(samples, min(batch_size, len(samples)))
        out.losses.append(trainer.sft_step(collate(batch, torch.zeros(len(batch)), tokenizer.pad_token_id), lr))
        if target is not None and step >= min_steps and step % check_interval == 0:
            out.train_accuracy = check()
            if out.train_accuracy >= target:
                break
    trainer.end_warm_start()
    return out


def accuracy_check(trainer: TrainBackend, rollout: RolloutBackend, prompts: list[Prompt], scorer: Scorer,
                   sampling: SamplingParams, offload_train: bool = False) -> Callable[[], float]:
    """A check for `warm_start`: the trainer's current weights, synced to the rollout, answer `prompts` greedily
    (one sample each, `sampling` with top_k=1); the mean reward. offload_train: the trainer is released meanwhile."""
    eval_set = EvalSet(prompts, dataclasses.replace(sampling, top_k=1), 1, scorer)

    def check() -> float:
        rollout.update_weights(trainer.named_weights(), version=0)
        with trainer_released(trainer, offload_train):
            return evaluate(rollout, {"warmstart": eval_set}, 0)[0]["eval/warmstart/accuracy"]

    return check


def run_warm_start(w: WarmStart, c: Components, offload_train: bool = False) -> dict[str, float]:
    """The engine's warm start: its metrics at step 0 (offload_train: the trainer released while its checks generate)."""
    t0 = time.perf_counter()
    check = None
    if w.target_train_accuracy is not None:
        prompts = random.Random(w.seed).sample(c.train_prompts, min(w.check_prompts, len(c.train_prompts)))
        check = accuracy_check(c.trainer, c.rollout, prompts, c.scorer, c.sampling, offload_train)
    res = warm_start(c.trainer, c.train_prompts, c.tokenizer, w.steps, w.batch_size, w.lr, w.seed,
                     w.custom_sft_samples, check, w.check_interval, w.target_train_accuracy, w.min_steps)
    metrics = {"warmstart/sft_loss": res.losses[-1], "warmstart/steps": float(res.steps),
               "perf/warmstart_time_s": time.perf_counter() - t0}
    if res.train_accuracy is not None:
        metrics["warmstart/train_accuracy"] = res.train_accuracy
    return metrics
