"""Reward post-processing, advantage estimators and whitening (slime semantics).

GRPO-family estimators (grpo, gspo, cispo) and rloo give one scalar per sample, broadcast to every response
token; REINFORCE++ variants give per-token values (`reinforce.py`); ppo gives GAE over the critic's
values (`critic.py`). The `*_estimator` functions share one call, [N] rewards -> [N, T] advantages on
the trainer's loss mask, and take their `algorithm.*` keys as keyword arguments of the same name; the
table in `estimators.py` names them, and the composition floor (app/algorithm.py) binds one, or
`ppo_advantages`, into the AdvantageSpec the engine calls. Nothing here knows an estimator's name.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from slime_hydra.algorithms.critic import gae_advantages
from slime_hydra.algorithms.groups import centred_groups, tied_groups
from slime_hydra.algorithms.reinforce import (
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    token_level_rewards,
)

# fn(rewards [N], mask [N, T], kl [N, T] | None, group_size, **kwargs) -> advantages [N, T]
CustomAdvantage = Callable[[Tensor, Tensor, Optional[Tensor], int], Tensor]


def group_normalize(
    rewards: Tensor, group_size: int, subtract_mean: bool = True, std_normalize: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO: r - mean_group (and / (std_group + eps)); std is torch's unbiased std, as slime.

    A tied group (every reward equal) gets exactly 0 when subtract_mean, whatever the values
    (`groups.centred_groups`); its std is taken as exactly 0 (torch gives NaN for a group of 1).
    Other groups get slime's numbers bit for bit.
    """
    r = rewards.view(-1, group_size)  # [B, G]
    adv = centred_groups(r) if subtract_mean else r.clone()  # [B, G]
    if std_normalize:
        std = r.std(dim=1, keepdim=True).masked_fill(tied_groups(r), 0.0)  # [B, 1]
        adv = adv / (std + eps)
    return adv.reshape(-1)  # [B*G]


def broadcast_to_tokens(sample_values: Tensor, mask: Tensor) -> Tensor:
    """[N] per-sample values -> [N, T] on the masked (response) positions, zero elsewhere."""
    return sample_values.to(mask.dtype)[:, None] * mask  # [N, T]


def grpo_advantages(rewards: Tensor, mask: Tensor, group_size: int, std_normalize: bool) -> Tensor:
    return broadcast_to_tokens(group_normalize(rewards, group_size, True, std_normalize), mask)


def leave_one_out(rewards: Tensor, group_size: int) -> Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): r_i minus the mean of the other G - 1 rewards of its group,
    which is G / (G - 1) * (r_i - mean_G r).

    A tied group gets exactly 0 (`groups.centred_groups`); other groups get verl's compute_rloo_outcome_advantage
    up to float rounding. A group of one has no other sample: its baseline is 0 and its advantage the raw reward,
    as verl (validation refuses rloo with rollout.n_samples_per_prompt=1).
    """
    if group_size == 1:
        return rewards.clone()  # [N]
    r = rewards.view(-1, group_size)  # [B, G]
    return (centred_groups(r) * (group_size / (group_size - 1))).reshape(-1)  # [B*G]


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(v - mean) / sqrt(var + eps) with mean and var over every masked token of the batch.

    As slime's distributed_masked_whiten (Bessel's n / (n - 1) when n >= 2; shift_mean=False adds the
    mean back; zero off the mask), but the variance is computed in two passes on values shifted by one
    of them, not as E[v^2] - mean^2: that difference cancels catastrophically and goes negative for
    constant or near-constant input (rsqrt -> NaN). Shifting by a masked value makes constant input
    give exactly 0 (exactly the constant with shift_mean=False); the result is otherwise slime's up to
    float rounding, and finite for finite input (var >= 0, and var + eps > 0).
    """
    n = mask.sum()
    if n.item() == 0:
        raise ValueError("masked_whiten: the mask has no valid token")
    pivot = values[mask > 0][0]  # a masked value: the shift that makes constant input exactly 0
    shifted = (values - pivot) * mask  # [N, T]
    shifted_mean = shifted.sum() / n
    centred = (shifted - shifted_mean) * mask  # [N, T]
    var = centred.pow(2).sum() / n  # two-pass: a sum of squares, >= 0
    if n.item() >= 2:
        var = var * n / (n - 1)
    out = centred * torch.rsqrt(var + eps)  # [N, T]
    if not shift_mean:
        out = out + (pivot + shifted_mean)
    return out * mask


# The estimators, in the advantage step's one call: (rewards [N], mask [N, T], kl [N, T] | None, group_size) ->
# advantages [N, T]. Their keyword arguments are algorithm keys of the same name, bound (functools.partial) by the
# composition floor into an AdvantageSpec.


def group_estimator(rewards: Tensor, mask: Tensor, kl: Optional[Tensor], group_size: int, *, rewards_normalization: bool,
                    grpo_std_normalization: bool) -> Tensor:
    """grpo / gspo / cispo: the group-normalised reward on every response token; the shaped KL is not applied (slime).

    The std division needs the mean subtracted too: rewards_normalization=false gives raw rewards (slime's reward
    post-processing)."""
    std_normalize = rewards_normalization and grpo_std_normalization
    return broadcast_to_tokens(group_normalize(rewards.to(mask.dtype), group_size, rewards_normalization, std_normalize), mask)


def rloo_estimator(rewards: Tensor, mask: Tensor, kl: Optional[Tensor], group_size: int, *,
                   rewards_normalization: bool) -> Tensor:
    """rloo: the leave-one-out advantage on every response token; the shaped KL is not applied (as the grpo family).
    rewards_normalization=false gives raw rewards, as it does for every group baseline."""
    r = rewards.to(mask.dtype)  # [N]
    return broadcast_to_tokens(leave_one_out(r, group_size) if rewards_normalization else r, mask)  # [N, T]


def reinforce_plus_plus_estimator(rewards: Tensor, mask: Tensor, kl: Optional[Tensor], group_size: int, *, kl_coef: float,
                                  gamma: float) -> Tensor:
    """REINFORCE++ (no group baseline: group_size is not read)."""
    return reinforce_plus_plus_advantages(rewards, mask, kl, kl_coef, gamma)


def reinforce_plus_plus_baseline_estimator(rewards: Tensor, mask: Tensor, kl: Optional[Tensor], group_size: int, *,
                                           kl_coef: float, rewards_normalization: bool) -> Tensor:
    return reinforce_plus_plus_baseline_advantages(rewards, mask, kl, kl_coef, group_size, rewards_normalization)


def plugin_estimator(rewards: Tensor, mask: Tensor, kl: Optional[Tensor], group_size: int, *, fn: CustomAdvantage) -> Tensor:
    """algorithm.custom_advantage: fn's advantages in the mask's dtype, zero off the mask."""
    return fn(rewards, mask, kl, group_size).to(mask.dtype) * mask


def whitened(rewards: Tensor, mask: Tensor, kl: Optional[Tensor], group_size: int, *, estimator: CustomAdvantage) -> Tensor:
    """algorithm.normalize_advantages: `estimator`'s advantages whitened over every masked token of the batch."""
    return masked_whiten(estimator(rewards, mask, kl, group_size), mask)


def ppo_advantages(rewards: Tensor, mask: Tensor, kl: Optional[Tensor], values: Tensor, *, kl_coef: float = 0.0,
                   gamma: float = 1.0, lambd: float = 1.0, normalize_advantages: bool = True) -> tuple[Tensor, Tensor]:
    """PPO: GAE(gamma, lambd) over the critic's values [N, T] of the KL-shaped token rewards
    (r_t = -kl_coef*kl_t, plus R at the last response token, as REINFORCE++).

    Returns (advantages [N, T], whitened over the batch's masked tokens when normalize_advantages;
    returns [N, T] = GAE + values before whitening: the critic's targets).
    """
    adv, returns = gae_advantages(values.to(mask.dtype), token_level_rewards(rewards, mask, kl, kl_coef), mask, gamma, lambd)
    return (masked_whiten(adv, mask) if normalize_advantages else adv), returns
