"""REINFORCE++ and REINFORCE++-baseline (Hu et al. 2025, arXiv:2501.03262), slime semantics.

Per-token tensors are [N, T] on the trainer's layout: position t predicts token t+1, `mask` is 1 on
response tokens that train (see training/batch.py). `kl` is the per-token KL(pi_old || ref) the
trainer computed for reward shaping (zeros or None when kl_coef = 0). Results are zero off the mask.
Whitening is not applied here; `advantages.masked_whiten` does it when normalize_advantages is on.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from slime_hydra.algorithms.groups import centred_groups


def last_token_index(mask: Tensor) -> Tensor:
    """[N] index of the last position with mask > 0 in each row (0 for a row with none)."""
    t = mask.shape[-1]
    has = mask > 0  # [N, T]
    return (t - 1 - has.flip(-1).to(torch.int64).argmax(-1)) * has.any(-1)  # [N]


def token_level_rewards(rewards: Tensor, mask: Tensor, kl: Optional[Tensor], kl_coef: float) -> Tensor:
    """r_t = -kl_coef * kl_t * mask_t, plus the scalar reward R at the last valid response token."""
    r = torch.zeros_like(mask) if kl is None else -kl_coef * kl.to(mask.dtype) * mask  # [N, T]
    rows = torch.arange(mask.shape[0])
    has = (mask > 0).any(-1).to(mask.dtype)  # [N] a row with no trained token gets no reward
    r[rows, last_token_index(mask)] += rewards.to(mask.dtype) * has
    return r  # [N, T]


def discounted_returns(token_rewards: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t+1}, G_T = 0, along each row.

    Every position is a time step, as slime's chunked_discounted_returns over the response: a masked
    out position inside the response (r_t = 0) still discounts by gamma once. Positions after the
    last reward stay 0; positions before the response are multiplied away by the caller's mask.
    """
    out = torch.zeros_like(token_rewards)  # [N, T]
    running = torch.zeros_like(token_rewards[:, 0])  # [N]
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        out[:, t] = running
    return out


def reinforce_plus_plus_advantages(rewards: Tensor, mask: Tensor, kl: Optional[Tensor], kl_coef: float, gamma: float) -> Tensor:
    """REINFORCE++: A_t = G_t of the KL-shaped token rewards (no group baseline). rewards: [N] raw."""
    return discounted_returns(token_level_rewards(rewards, mask, kl, kl_coef), gamma) * mask  # [N, T]


def reinforce_plus_plus_baseline_advantages(
    rewards: Tensor, mask: Tensor, kl: Optional[Tensor], kl_coef: float, group_size: int, subtract_mean: bool = True
) -> Tensor:
    """REINFORCE++-baseline: A_t = (R - mean_group(R)) - kl_coef * kl_t on every response token.

    subtract_mean is algorithm.rewards_normalization (slime centres rewards for this estimator, never
    divides by the group std).
    """
    r = rewards.to(mask.dtype).view(-1, group_size)  # [B, G]
    centred = (centred_groups(r) if subtract_mean else r).reshape(-1)  # [N] a tied group: exactly 0
    adv = centred[:, None].expand_as(mask)  # [N, T]
    if kl is not None:
        adv = adv - kl_coef * kl.to(mask.dtype)
    return adv * mask  # [N, T]
