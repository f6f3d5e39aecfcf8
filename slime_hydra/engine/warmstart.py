"""Supervised warm start (slime's loss_type=sft_loss): teach the answer format before RL.

Targets are `label + eos` after the prompt; only those tokens train.
"""

from __future__ import annotations

import random
from typing import Callable, Optional

import torch

from slime_hydra.data.dataset import Prompt
from slime_hydra.training.base import TrainBackend
from slime_hydra.training.batch import collate
from slime_hydra.types import Sample


def sft_samples(prompts: list[Prompt], tokenizer) -> list[Sample]:
    out = []
    for p in prompts:
        target = tokenizer(p.label, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append(Sample(prompt=p.prompt, label=p.label, prompt_tokens=p.tokens, tokens=p.tokens + target,
                          response_length=len(target), loss_mask=[1] * len(target)))
    return out


def warm_start(trainer: TrainBackend, prompts: list[Prompt], tokenizer, steps: int, batch_size: int, lr: float,
               seed: int, custom_sft_samples: Optional[Callable[..., list[Sample]]] = None) -> list[float]:
    """custom_sft_samples (warmstart.custom_sft_samples): fn(prompts, tokenizer) -> samples with their own loss masks."""
    samples = (custom_sft_samples or sft_samples)(prompts, tokenizer)
    rng = random.Random(seed)
    losses = []
    for _ in range(steps):
        batch = rng.sample(samples, min(batch_size, len(samples)))
        losses.append(trainer.sft_step(collate(batch, torch.zeros(len(batch)), tokenizer.pad_token_id), lr))
    trainer.end_warm_start()
    return losses
