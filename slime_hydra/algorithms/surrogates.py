"""Policy-gradient surrogates beyond PPO-clip, and truncated importance sampling (slime semantics).

Each surrogate returns (loss [N, T], clipped [N, T] as 0/1, ppo_kl [N, T]) like `ppo_clip_loss`, so
the trainer aggregates them the same way. Left out: OPSM (off-policy sequence masking) and
icepop / custom TIS functions; they would be new functions here and new config keys.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from slime_hydra.algorithms.losses import clipped_surrogate


def sequence_mean_log_ratio(log_probs: Tensor, old_log_probs: Tensor, mask: Tensor) -> Tensor:
    """GSPO's ppo_kl: per sample, the masked mean of (old - new) over its response tokens, on every position.

    A sample with no trained token gets 0 (its count is clamped to 1, as slime's compute_gspo_kl).
    """
    per_sample = ((old_log_probs - log_probs) * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
    return per_sample[:, None].expand_as(log_probs)  # [N, T]


def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_clip: float,
    eps_clip_high: Optional[float] = None,
    eps_clip_c: Optional[float] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """GSPO (Zheng et al. 2025): the PPO-clip surrogate on the sequence-level ratio.

    s_i = exp(mean_t∈mask(new - old)) replaces the token ratio; the gradient reaches every token of
    the sample through the mean. Clipping, dual clip and clipfrac are those of `clipped_surrogate`.
    """
    seq_kl = sequence_mean_log_ratio(log_probs, old_log_probs, mask)  # [N, T]
    loss, clipped = clipped_surrogate(seq_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)
    return loss, clipped, seq_kl


def cispo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: Optional[float] = None,
    *,
    mask: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """CISPO (MiniMax-M1, 2025): L_t = -sg(clip(ratio, 1 - eps_clip, 1 + eps_clip_high)) * A_t * log pi_theta.

    The clipped ratio is a constant weight, so clipped tokens still pass gradient through log pi_theta.
    clipped = 1 where the clamp changed the ratio (slime's compute_cispo_loss). `mask` is not read (per
    token); it is taken so that every surrogate has one call.
    """
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    ppo_kl = old_log_probs - log_probs  # [N, T]
    ratio = torch.exp(-ppo_kl)  # [N, T]
    truncated = ratio.clamp(1 - eps_clip, 1 + eps_high)  # [N, T]
    loss = -truncated.detach() * advantages * log_probs  # [N, T]
    return loss, (truncated != ratio).to(log_probs.dtype), ppo_kl


def plugin_surrogate(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, *, fn: Callable[..., Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """algorithm.custom_loss as a surrogate: fn(log_probs, old_log_probs, advantages, mask) -> loss [N, T]; it
    clips nothing (clipped 0) and its ppo_kl is the token log-ratio old - new."""
    return fn(log_probs, old_log_probs, advantages, mask), torch.zeros_like(log_probs), old_log_probs - log_probs


def truncated_is(pg_loss: Tensor, old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, *, tis_clip_low: float,
                 tis_clip: float) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """slime's vanilla TIS in the shape of algorithm.custom_tis_function: (pg_loss × w, the mask unchanged,
    {"tis_clipfrac": [N, T]})."""
    w, clipfrac = tis_weights(old_log_probs, rollout_log_probs, tis_clip_low, tis_clip)
    return pg_loss * w, mask, {"tis_clipfrac": clipfrac}


def tis_weights(old_log_probs: Tensor, rollout_log_probs: Tensor, tis_clip_low: float, tis_clip: float) -> tuple[Tensor, Tensor]:
    """Truncated importance sampling (Yao et al. 2025, slime's vanilla_tis_function).

    w_t = clamp(exp(old - rollout), tis_clip_low, tis_clip), detached: it corrects for the rollout
    engine sampling from a slightly different distribution than the trainer computes. Multiply the
    per-token policy loss by w. Returns (w [N, T], tis_clipfrac [N, T]: 1 where the clamp acted).
    """
    tis = torch.exp(old_log_probs - rollout_log_probs).detach()  # [N, T]
    w = tis.clamp(tis_clip_low, tis_clip)  # [N, T]
    return w, (w != tis).to(tis.dtype)
