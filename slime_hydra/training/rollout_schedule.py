"""One rollout's training, the same under every trainer: which models train, in which optimizer steps, and when the KL
reference follows the policy.

The critic (ppo) trains on every rollout, before the policy; the policy sits out the first `critic_only` rollouts
(algorithm.num_critic_only_steps); every `ref_update_interval` rollouts the KL reference takes the policy's weights
(slime's --ref-update-interval). A rollout's samples are `num_steps_per_rollout` optimizer steps of consecutive equal
slices, and the rollout's metrics are the steps' averages. Old log-probs are recomputed with the weights from before
the rollout's first step for the samples of later steps; on the first step they are the step's own forward pass
(detached), so its ppo_kl is exactly 0 and no extra pass is spent on them. With use_rollout_logprobs the rollout
engine's log-probs are the old ones.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from slime_hydra.protocols import TrainBatch
from slime_hydra.training.optim import COUNTED
from slime_hydra.training.specs import BatchSpec, CriticSpec, LossSpec

Metrics = dict[str, float]
# train_step(batch, rows of one optimizer step, [N, T] old log-probs or None: the step's own, detached) -> its metrics
TrainStep = Callable[[TrainBatch, torch.Tensor, Optional[torch.Tensor]], Metrics]


@dataclass
class RolloutSchedule:
    num_steps: int  # train.num_steps_per_rollout
    use_rollout_logprobs: bool  # the old log-probs are the rollout engine's
    critic_only: int  # the first rollouts that train the critic alone
    ref_update_interval: Optional[int]  # None: the reference stays as frozen
    rollouts_trained: int = 0  # part of the trainer's resume state

    @classmethod
    def of(cls, loss: LossSpec, batch: BatchSpec, critic: Optional[CriticSpec]) -> RolloutSchedule:
        return cls(batch.num_steps_per_rollout, loss.use_rollout_logprobs,
                   critic.num_critic_only_steps if critic is not None else 0, loss.ref_update_interval)

    def train(self, batch: TrainBatch, train_step: TrainStep, log_probs: Callable[[TrainBatch], torch.Tensor],
              critic: Optional[Callable[[TrainBatch], Metrics]], reference: Optional[nn.Module], policy: nn.Module) -> Metrics:
        """One rollout: the critic's steps (if any), then the policy's (policy_steps: train_step, with old log-probs
        from log_probs), unless a critic-only rollout; then, when due, `reference` takes `policy`'s weights. The metrics
        of both."""
        metrics = critic(batch) if critic is not None else {}
        if self.rollouts_trained >= self.critic_only:
            metrics |= policy_steps(batch, self.num_steps, self.use_rollout_logprobs, log_probs, train_step)
        self.rollouts_trained += 1
        if reference is not None and self.ref_update_interval and self.rollouts_trained % self.ref_update_interval == 0:
            reference.load_state_dict(policy.state_dict())
        return metrics


def optimizer_steps(batch: TrainBatch, num_steps: int, step: Callable[[int, torch.Tensor], Metrics]) -> Metrics:
    """step(i, rows) for the i-th of `num_steps` consecutive equal slices of the batch's rows, in order; their metrics
    averaged over the steps (counts, like the skipped steps, summed)."""
    gbs = batch.num_samples // num_steps
    sums: Metrics = defaultdict(float)
    for i in range(num_steps):
        for k, v in step(i, torch.arange(i * gbs, (i + 1) * gbs)).items():
            sums[k] += v if k in COUNTED else v / num_steps
    return dict(sums)


def policy_steps(batch: TrainBatch, num_steps: int, use_rollout_logprobs: bool, log_probs: Callable[[TrainBatch], torch.Tensor],
                 train_step: TrainStep) -> Metrics:
    """The policy's optimizer steps of one rollout: train_step(batch, rows, old) with `old` the [N, T] pre-update
    log-probs (log_probs, before the first step) for the steps after the first, None for the first (and for every
    step when the rollout's log-probs are the old ones)."""
    old_later = None
    if num_steps > 1 and not use_rollout_logprobs:
        gbs = batch.num_samples // num_steps
        later = log_probs(batch.select(torch.arange(gbs, batch.num_samples)))
        old_later = torch.zeros_like(batch.loss_mask)
        old_later[gbs:, : later.shape[1]] = later
    return optimizer_steps(batch, num_steps, lambda i, rows: train_step(batch, rows, old_later if i > 0 else None))
