"""The PPO-clip surrogate, KL estimators, entropy and loss aggregation.

Shapes: N samples, T target positions (position t predicts token t+1), V vocabulary.
`mask` is 1 on response tokens that train. Aggregation takes an explicit denominator so that
micro-batches summed under gradient accumulation give exactly the loss of the whole step.
The GSPO / CISPO surrogates and TIS live in `surrogates.py`; critic-side math in `critic.py`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def _upcast(logits: Tensor) -> Tensor:
    """bf16 / fp16 logits are reduced in fp32; fp32 and fp64 keep their precision."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def log_probs_from_logits(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each target under softmax(logits / temperature)."""
    logp = torch.log_softmax(_upcast(logits) / temperature, dim=-1)  # [N, T, V]
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, T]


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    logp = torch.log_softmax(_upcast(logits) / temperature, dim=-1)  # [N, T, V]
    return -(logp.exp() * logp).sum(-1)  # [N, T]


def _kl_unclamped(log_probs: Tensor, ref_log_probs: Tensor, kl_type: str) -> Tensor:
    log_ratio = log_probs - ref_log_probs  # [N, T]
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return log_ratio.pow(2) / 2
    if kl_type in ("k3", "low_var_kl"):
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise ValueError(f"unknown kl_type {kl_type!r}")


def _clamp_low_var(kl: Tensor, kl_type: str) -> Tensor:
    return kl.clamp(-10, 10) if kl_type == "low_var_kl" else kl


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, kl_type: str) -> Tensor:
    """Per-token KL(pi || ref) estimators (Schulman's k1/k2/k3); low_var_kl is k3 clamped to [-10, 10]."""
    return _clamp_low_var(_kl_unclamped(log_probs, ref_log_probs, kl_type), kl_type)  # [N, T]


def unbiased_kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, old_log_probs: Tensor, kl_type: str) -> Tensor:
    """DeepSeek-V3.2's unbiased KL (slime's use_unbiased_kl): the estimator times pi_theta / pi_old.

    As slime (compute_approx_kl): the ratio exp(log_probs - old_log_probs) is NOT detached, so the
    gradient also flows through it (that is what makes the gradient unbiased under samples from
    pi_old), and low_var_kl's clamp to [-10, 10] applies after the multiplication.
    """
    ratio = torch.exp(log_probs - old_log_probs)  # [N, T]
    return _clamp_low_var(ratio * _kl_unclamped(log_probs, ref_log_probs, kl_type), kl_type)  # [N, T]


def ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: Optional[float] = None,
    eps_clip_c: Optional[float] = None,
    *,
    mask: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO-clipped surrogate per token. Returns (loss [N, T], clipped [N, T] as 0/1, ppo_kl [N, T]).

    `mask` is not read (the surrogate is per token); it is taken so that every surrogate has one call.

    L = max(-ratio*A, -clip(ratio, 1-eps_clip, 1+eps_clip_high)*A); with dual clip, for A < 0
    L = min(L, -eps_clip_c*A).
    """
    ppo_kl = old_log_probs - log_probs  # [N, T]
    loss, clipped = clipped_surrogate(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)
    return loss, clipped, ppo_kl


def clipped_surrogate(
    ppo_kl: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: Optional[float] = None,
    eps_clip_c: Optional[float] = None,
) -> tuple[Tensor, Tensor]:
    """The clipped objective on a given ppo_kl (ratio = exp(-ppo_kl)), slime's compute_policy_loss.

    Token-level for PPO/GRPO; GSPO passes its sequence-level ppo_kl. Returns (loss [N, T], clipped [N, T]).
    """
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = torch.exp(-ppo_kl)  # [N, T]
    loss_unclipped = -ratio * advantages
    loss_clipped = -ratio.clamp(1 - eps_clip, 1 + eps_high) * advantages
    loss = torch.maximum(loss_unclipped, loss_clipped)  # [N, T]
    clipped = (loss_clipped > loss_unclipped).to(loss.dtype)
    if eps_clip_c is not None:
        # clipfrac counts the eps_clip branch only, as slime does; the dual clip changes the loss alone
        loss = torch.where(advantages < 0, torch.minimum(loss, -eps_clip_c * advantages), loss)
    return loss, clipped


def sft_token_loss(log_probs: Tensor) -> Tensor:
    """Negative log-likelihood per token (slime's sft_loss before aggregation)."""
    return -log_probs  # [N, T]


LOSS_AGGREGATIONS = ("sample_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


def aggregate(values: Tensor, mask: Tensor, mode: str, denominator: float) -> Tensor:
    """Reduce per-token values to the scalar loss of a whole step.

    sample_token_mean:       sum_i (sum_t v_it m_it / sum_t m_it) / denominator, denominator = samples in the step
    token_mean:              sum_it v_it m_it / denominator, denominator = masked tokens in the step
    seq_mean_token_sum:      sum_i (sum_t v_it m_it) / denominator, denominator = samples in the step
    seq_mean_token_sum_norm: sum_i (sum_t v_it m_it / C) / samples = sum_it v_it m_it / denominator,
                             denominator = samples in the step × C, C = max response length (Dr.GRPO)
    A sample with no trained token adds 0 to the sum; under token_mean it adds nothing to the
    denominator either, under the per-sample modes it counts as a sample. A denominator of 0 (a step
    with no trained token) gives 0.
    """
    masked = values * mask  # [N, T]
    if denominator == 0:  # token_mean over a step with no trained token: its loss is 0, not 0 / 0
        denominator = 1.0
    if mode == "sample_token_mean":
        per_sample = masked.sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
        return per_sample.sum() / denominator
    if mode in ("token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        return masked.sum() / denominator  # the modes differ in their denominators only
    raise ValueError(f"unknown loss_aggregation {mode!r}")


def step_denominator(masks: list[Tensor], mode: str, max_response_len: Optional[int] = None) -> float:
    """The denominator `aggregate` needs for a step made of these micro-batch masks."""
    samples = float(sum(m.shape[0] for m in masks))
    if mode in ("sample_token_mean", "seq_mean_token_sum"):
        return samples
    if mode == "token_mean":
        return float(sum(m.sum().item() for m in masks))
    if mode == "seq_mean_token_sum_norm":
        if not max_response_len or max_response_len < 1:
            raise ValueError("loss_aggregation=seq_mean_token_sum_norm needs max_response_len >= 1 "
                             "(the constant normalizer, rollout.rollout_max_response_len)")
        return samples * max_response_len
    raise ValueError(f"unknown loss_aggregation {mode!r}")


def metric_aggregation(mode: str) -> str:
    """How per-token metrics (clip fractions, ppo_kl, entropy) are averaged under a loss mode.

    Token-sum modes would turn a fraction into a count, so metrics use the per-sample token mean
    for them (slime logs metrics through its sum_of_sample_mean); token_mean keeps token_mean.
    """
    return "token_mean" if mode == "token_mean" else "sample_token_mean"
