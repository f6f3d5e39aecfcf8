"""The loop's steps as small functions: rollout, advantages, metrics, eval."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import torch

from slime_hydra.algorithms.advantages import group_normalize
from slime_hydra.config.schema import AlgorithmConfig, EvalConfig, RolloutConfig
from slime_hydra.data.dataset import Prompt
from slime_hydra.data.source import PromptSource
from slime_hydra.rewards.compute import score
from slime_hydra.rollout.base import RolloutBackend
from slime_hydra.types import Sample, SamplingParams, Status


def rollout_sampling(r: RolloutConfig, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    return SamplingParams(r.rollout_temperature, r.rollout_top_p, r.rollout_top_k, r.rollout_max_response_len,
                          tuple(r.rollout_stop_token_ids) + stop_token_ids, tuple(r.rollout_stop))


def eval_sampling(e: EvalConfig, rollout: SamplingParams) -> SamplingParams:
    pick = lambda v, d: d if v is None else v  # noqa: E731
    return SamplingParams(pick(e.eval_temperature, rollout.temperature), pick(e.eval_top_p, rollout.top_p),
                          pick(e.eval_top_k, rollout.top_k), pick(e.eval_max_response_len, rollout.max_new_tokens),
                          rollout.stop_token_ids, rollout.stop)


def generate(rollout: RolloutBackend, source: PromptSource, num_groups: int, sampling: SamplingParams) -> list[Sample]:
    groups = source.next_groups(num_groups)
    samples = [s for g in groups for s in g]
    return asyncio.run(rollout.generate(samples, sampling))


def advantages(samples: list[Sample], algo: AlgorithmConfig, group_size: int) -> torch.Tensor:
    """[N] per-sample advantages for the GRPO family."""
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    return group_normalize(rewards, group_size, algo.rewards_normalization, algo.grpo_std_normalization)


def rollout_metrics(samples: list[Sample], group_size: int) -> dict[str, float]:
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    lengths = torch.tensor([s.response_length for s in samples], dtype=torch.float32)
    grouped = rewards.view(-1, group_size)
    return {
        "rollout/reward_mean": rewards.mean().item(),
        "rollout/reward_std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "rollout/response_len_mean": lengths.mean().item(),
        "rollout/truncated_ratio": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
        "rollout/zero_std_group_ratio": (grouped.std(dim=1) == 0).float().mean().item(),
        "rollout/weight_version": float(max(s.weight_version for s in samples)),
    }


def evaluate(rollout: RolloutBackend, eval_sets: dict[str, list[Prompt]], sampling: SamplingParams,
             n_samples: int, reward_fn: Callable[[Sample], float]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for name, prompts in eval_sets.items():
        t0 = time.perf_counter()
        samples = [Sample(prompt=p.prompt, label=p.label, group_index=i, index=i * n_samples + j,
                          prompt_tokens=list(p.tokens), metadata=dict(p.metadata))
                   for i, p in enumerate(prompts) for j in range(n_samples)]
        asyncio.run(rollout.generate(samples, sampling))
        score(samples, reward_fn)
        metrics[f"eval/{name}/accuracy"] = sum(s.reward for s in samples) / len(samples)
        metrics[f"eval/{name}/response_len_mean"] = sum(s.response_length for s in samples) / len(samples)
        metrics[f"perf/eval_{name}_time_s"] = time.perf_counter() - t0
    return metrics
