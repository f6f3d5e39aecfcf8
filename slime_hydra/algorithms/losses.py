"""Policy-gradient surrogates, KL estimators, entropy and loss aggregation.

Shapes: N samples, T target positions (position t predicts token t+1), V vocabulary.
`mask` is 1 on response tokens that train. Aggregation takes an explicit denominator so that
micro-batches summed under gradient accumulation give exactly the loss of the whole step.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def log_probs_from_logits(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each target under softmax(logits / temperature)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [N, T, V]
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, T]


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [N, T, V]
    return -(logp.exp() * logp).sum(-1)  # [N, T]


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, kl_type: str) -> Tensor:
    """Per-token KL(pi || ref) estimators (Schulman's k1/k2/k3); low_var_kl is k3 clamped to [-10, 10]."""
    log_ratio = log_probs - ref_log_probs  # [N, T]
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return log_ratio.pow(2) / 2
    if kl_type in ("k3", "low_var_kl"):
        kl = torch.exp(-log_ratio) - 1 + log_ratio
        return kl.clamp(-10, 10) if kl_type == "low_var_kl" else kl
    raise ValueError(f"unknown kl_type {kl_type!r}")


def ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: Optional[float] = None,
    eps_clip_c: Optional[float] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO-clipped surrogate per token. Returns (loss [N, T], clipped [N, T] as 0/1, ppo_kl [N, T]).

    L = max(-ratio*A, -clip(ratio, 1-eps_clip, 1+eps_clip_high)*A); with dual clip, for A < 0
    L = min(L, -eps_clip_c*A).
    """
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    ppo_kl = old_log_probs - log_probs  # [N, T]
    ratio = torch.exp(-ppo_kl)  # [N, T]
    loss_unclipped = -ratio * advantages
    loss_clipped = -ratio.clamp(1 - eps_clip, 1 + eps_high) * advantages
    loss = torch.maximum(loss_unclipped, loss_clipped)  # [N, T]
    clipped = (loss_clipped > loss_unclipped).float()
    if eps_clip_c is not None:
        # clipfrac counts the eps_clip branch only, as slime does; the dual clip changes the loss alone
        loss = torch.where(advantages < 0, torch.minimum(loss, -eps_clip_c * advantages), loss)
    return loss, clipped, ppo_kl


def sft_token_loss(log_probs: Tensor) -> Tensor:
    """Negative log-likelihood per token (slime's sft_loss before aggregation)."""
    return -log_probs  # [N, T]


def aggregate(values: Tensor, mask: Tensor, mode: str, denominator: float) -> Tensor:
    """Reduce per-token values to the scalar loss of a whole step.

    sample_token_mean: sum_i (sum_t v_it m_it / sum_t m_it) / denominator, denominator = samples in the step
    token_mean:        sum_it v_it m_it / denominator, denominator = masked tokens in the step
    """
    masked = values * mask  # [N, T]
    if mode == "sample_token_mean":
        per_sample = masked.sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
        return per_sample.sum() / denominator
    if mode == "token_mean":
        return masked.sum() / denominator
    raise ValueError(f"unknown loss_aggregation {mode!r}")


def step_denominator(masks: list[Tensor], mode: str) -> float:
    """The denominator `aggregate` needs for a step made of these micro-batch masks."""
    if mode == "sample_token_mean":
        return float(sum(m.shape[0] for m in masks))
    return float(sum(m.sum().item() for m in masks))
