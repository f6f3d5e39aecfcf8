"""Reward post-processing and advantage estimators (slime semantics).

GRPO-family estimators give one scalar per sample, broadcast to every response token by the loss.
Deliberately left out here: PPO/GAE and REINFORCE++ (the algorithms issue adds them as new
functions, not as flags on these).
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_normalize(
    rewards: Tensor, group_size: int, subtract_mean: bool = True, std_normalize: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO: r - mean_group (and / (std_group + eps)); std is torch's unbiased std, as slime."""
    r = rewards.view(-1, group_size)  # [B, G]
    adv = r - r.mean(dim=1, keepdim=True) if subtract_mean else r.clone()  # [B, G]
    if std_normalize:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)
    return adv.reshape(-1)  # [B*G]


def broadcast_to_tokens(sample_values: Tensor, mask: Tensor) -> Tensor:
    """[N] per-sample values -> [N, T] on the masked (response) positions, zero elsewhere."""
    return sample_values.to(mask.dtype)[:, None] * mask  # [N, T]


def grpo_advantages(rewards: Tensor, mask: Tensor, group_size: int, std_normalize: bool) -> Tensor:
    return broadcast_to_tokens(group_normalize(rewards, group_size, True, std_normalize), mask)
