"""The loop's steps as small functions: rollout, advantages, metrics, eval."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import torch

from slime_hydra.agent.metrics import agent_metrics
from slime_hydra.aio import run_sync
from slime_hydra.algorithms.groups import tied_groups
from slime_hydra.config.schema import EvalDatasetConfig, RolloutConfig
from slime_hydra.data.dataset import Prompt
from slime_hydra.data.source import prompt_group
from slime_hydra.engine.rollout_hooks import converted, removed_rows
from slime_hydra.protocols import RolloutBackend, Scorer, TrainBackend, TrainBatch
from slime_hydra.training.batch import collate
from slime_hydra.training.specs import AdvantageSpec
from slime_hydra.types import Sample, SamplingParams, Status


def rollout_sampling(r: RolloutConfig, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    return SamplingParams(r.rollout_temperature, r.rollout_top_p, r.rollout_top_k, r.rollout_max_response_len,
                          tuple(r.rollout_stop_token_ids) + stop_token_ids, tuple(r.rollout_stop))


def eval_sampling(ds: EvalDatasetConfig, rollout: SamplingParams) -> SamplingParams:
    """A resolved eval dataset's sampling (its fallbacks were filled in by validation)."""
    return SamplingParams(ds.eval_temperature, ds.eval_top_p, ds.eval_top_k, ds.eval_max_response_len,
                          rollout.stop_token_ids, rollout.stop)


def advantages(samples: list[Sample], spec: AdvantageSpec, group_size: int, pad_id: int, trainer: TrainBackend,
               convert: Optional[Callable] = None) -> TrainBatch:
    """Collate (or rollout.custom_convert_samples_to_train_data), the rows of removed samples (rollout_sample_filter)
    loss-masked, then [N, T] per-token advantages on the batch's loss mask (REINFORCE++ needs it); the
    reward-shaping KL comes from the trainer (policy vs reference) only with spec.shaping_kl, and a
    critic estimator's values from the trainer's critic (batch.values and batch.returns are its targets)."""
    batch = converted(convert, samples, pad_id) if convert else collate(samples, torch.zeros(len(samples)), pad_id)
    if removed := removed_rows(samples):
        batch.loss_mask[removed] = 0.0
    # reward.custom_reward_post_process: the rewards the estimator reads; the samples keep theirs (rollout/reward_mean)
    raw = spec.reward_post_process(samples, group_size) if spec.reward_post_process else [s.reward for s in samples]
    rewards = torch.tensor(raw, dtype=torch.float32)
    kl = trainer.reward_kl(batch) if spec.shaping_kl else None
    if spec.gae is not None:
        batch.values = trainer.values(batch)  # [N, T] the critic's, at rollout time
        batch.advantages, batch.returns = spec.gae(rewards, batch.loss_mask, kl, batch.values)
    else:
        batch.advantages = spec.estimate(rewards, batch.loss_mask, kl, group_size)
    return batch


def rollout_metrics(samples: list[Sample], group_size: int) -> dict[str, float]:
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    lengths = torch.tensor([s.response_length for s in samples], dtype=torch.float32)
    grouped = rewards.view(-1, group_size)
    return {
        "rollout/reward_mean": rewards.mean().item(),
        "rollout/reward_std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "rollout/response_len_mean": lengths.mean().item(),
        "rollout/truncated_ratio": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
        # rewards that all agree, compared exactly: grouped.std() of eight float32 5.3s is ~5e-7, not 0
        "rollout/zero_std_group_ratio": tied_groups(grouped).float().mean().item(),
        "rollout/weight_version": float(max(s.weight_version for s in samples)),
    } | agent_metrics(samples)


@dataclass
class EvalSet:
    prompts: list[Prompt]
    sampling: SamplingParams
    n_samples: int
    scorer: Scorer


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_ks(n: int) -> list[int]:
    return sorted({k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= n} | {n})


# eval.eval_function: async fn(step, rollout, prompts, n_samples, sampling) -> n_samples per prompt, in prompt order
EvalFunction = Callable[[int, RolloutBackend, list[Prompt], int, SamplingParams], Awaitable[list[Sample]]]
# logger.custom_rollout_log_function (rollout_id, samples, metrics, rollout_time) and logger.custom_eval_rollout_log_function
# (step, {set: samples}, metrics): True | {name: value} | None
LogFunction = Callable[..., Any]


def logged(answer: Any, metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """The step's metrics after a log function's answer: True leaves out the `prefix` ones (slime's "skip the default
    logging"), a dict adds its own, anything else changes nothing."""
    if answer is True:
        return {k: v for k, v in metrics.items() if not k.startswith(prefix)}
    if isinstance(answer, dict):
        return metrics | {str(k): float(v) for k, v in answer.items()}
    return metrics


def generate_groups(rollout: RolloutBackend, prompts: list[Prompt], n: int, sampling: SamplingParams) -> list[Sample]:
    """`n` fresh samples of each prompt (group i = prompts[i]), generated."""
    samples = [s for i, p in enumerate(prompts) for s in prompt_group(p, i, n)]
    run_sync(rollout.generate(samples, sampling))
    return samples


def eval_samples(rollout: RolloutBackend, name: str, es: EvalSet, step: int, generate: Optional[EvalFunction]) -> list[Sample]:
    """An eval set's n samples per prompt, in prompt order: sampled, or eval.eval_function's."""
    if generate is None:
        return generate_groups(rollout, es.prompts, es.n_samples, es.sampling)
    samples = run_sync(generate(step, rollout, es.prompts, es.n_samples, es.sampling))
    if len(samples) != es.n_samples * len(es.prompts):
        raise ValueError(f"eval.eval_function returned {len(samples)} samples for eval set {name}; it must return "
                         f"n_samples={es.n_samples} per prompt for its {len(es.prompts)} prompts, in prompt order")
    return samples


def evaluate(rollout: RolloutBackend, eval_sets: dict[str, EvalSet], step: int, sample_dir: Optional[Path] = None, *,
             generate: Optional[EvalFunction] = None, log: Optional[LogFunction] = None) -> tuple[dict[str, float], list[Path]]:
    """Metrics per dataset (accuracy = mean reward, pass@k, response length) and the sample files written. generate:
    eval.eval_function in place of sampling each prompt n times; log: logger.custom_eval_rollout_log_function."""
    metrics: dict[str, float] = {}
    files: list[Path] = []
    by_set: dict[str, list[Sample]] = {}
    for name, es in eval_sets.items():
        t0 = time.perf_counter()
        n = es.n_samples
        samples = by_set[name] = eval_samples(rollout, name, es, step, generate)
        es.scorer.score(samples)
        correct = [sum(s.reward > 0 for s in samples[i * n:(i + 1) * n]) for i in range(len(es.prompts))]
        metrics[f"eval/{name}/accuracy"] = sum(s.reward for s in samples) / len(samples)
        for k in eval_ks(n):
            metrics[f"eval/{name}/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
        metrics[f"eval/{name}/response_len_mean"] = sum(s.response_length for s in samples) / len(samples)
        metrics |= agent_metrics(samples, prefix=f"eval/{name}")
        metrics[f"perf/eval_{name}_time_s"] = time.perf_counter() - t0
        if sample_dir is not None:
            files.append(write_samples(samples, sample_dir / name / f"step_{step:06d}.jsonl"))
    return (logged(log(step, by_set, dict(metrics)), metrics, "eval/") if log else metrics), files


def write_samples(samples: list[Sample], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for s in samples:
            f.write(json.dumps({"group_index": s.group_index, "index": s.index, "prompt": s.prompt, "response": s.response,
                                "label": s.label, "reward": s.reward, "response_length": s.response_length,
                                "status": s.status.value, "weight_version": s.weight_version}) + "\n")
    return path
