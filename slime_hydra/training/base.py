"""What every trainer shares: the reward-shaping KL. (The TrainBackend Protocol and TrainBatch: slime_hydra/protocols.py.)"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from slime_hydra.algorithms.losses import kl_estimate
from slime_hydra.protocols import TrainBatch
from slime_hydra.training.specs import LossSpec


def shaping_kl(batch: TrainBatch, loss: LossSpec, log_probs: Callable[..., torch.Tensor], ref: Optional[object]) -> torch.Tensor:
    """[N, T] KL(pi_old || ref) on the loss mask for algorithm.kl_coef's reward shaping (slime: old = the
    recomputed log-probs, or the rollout's with use_rollout_logprobs; estimator kl_loss_type).
    `log_probs(batch, model=None)` is the backend's log-prob pass; `ref` its frozen reference."""
    if ref is None:
        raise RuntimeError("reward_kl needs the reference model: call freeze_reference() first (algorithm.kl_coef != 0)")
    old = batch.rollout_log_probs if loss.use_rollout_logprobs else log_probs(batch)
    return kl_estimate(old, log_probs(batch, ref), loss.kl_loss_type) * batch.loss_mask  # [N, T]
