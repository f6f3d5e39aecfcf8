"""PPO's critic-side math: GAE and the clipped value loss (slime semantics), as pure functions.

`advantages.ppo_advantages` runs GAE over the critic's values; `training/critic.py` trains on the value loss.
Shapes: [N, T] on the trainer's layout; `mask` is 1 on response tokens that train.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gae_advantages(values: Tensor, rewards: Tensor, mask: Tensor, gamma: float, lambd: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over each row's response tokens.

    delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lambd * A_{t+1},   returns = A + V,
    with V and r taken as 0 off the mask, so the value after the last response token is 0 (slime's
    vanilla_gae / chunked_gae over the response). Rewards are per token (ppo's token rewards:
    `reinforce.token_level_rewards`). Returns (advantages [N, T], returns [N, T]), zero off the mask.
    """
    v, r = values * mask, rewards * mask  # [N, T]
    adv = torch.zeros_like(v)  # [N, T]
    last = torch.zeros_like(v[:, 0])  # [N]
    next_v = torch.zeros_like(v[:, 0])  # [N]
    for t in reversed(range(v.shape[1])):
        delta = r[:, t] + gamma * next_v - v[:, t]
        last = delta + gamma * lambd * last
        adv[:, t] = last
        next_v = v[:, t]
    adv = adv * mask
    return adv, (adv + v) * mask


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, value_clip: float) -> tuple[Tensor, Tensor]:
    """PPO's clipped value loss, slime's value_loss_function before aggregation.

    V_clip = V_old + clamp(V - V_old, -value_clip, value_clip); L_t = max((V_clip - G)^2, (V - G)^2).
    Returns (loss [N, T], value_clipfrac [N, T]: 1 where |V - V_old| > value_clip).
    """
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)  # [N, T]
    loss = torch.maximum((clipped - returns) ** 2, (values - returns) ** 2)  # [N, T]
    return loss, ((values - old_values).abs() > value_clip).to(values.dtype)
