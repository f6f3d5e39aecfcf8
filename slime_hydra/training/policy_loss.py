"""The per-micro-batch policy loss both trainers compose (train=torch and train=megatron).

A backend computes the log-probs and entropy of one micro-batch its own way (full logits in
torch; vocab-parallel, chunked in megatron) and hands them here; everything after that (old
log-probs, surrogate, TIS, aggregation, entropy bonus, KL loss, metrics) is this one function.
Scalars are divided by the whole step's `denom`, so they sum exactly over micro-batches.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from slime_hydra.algorithms import losses as L
from slime_hydra.algorithms import surrogates as S
from slime_hydra.config.schema import AlgorithmConfig


def old_log_probs(a: AlgorithmConfig, logp: Tensor, rollout_lp: Optional[Tensor], old_rows: Optional[Tensor]) -> Tensor:
    """[n, T] old log-probs: the rollout's (use_rollout_logprobs), recomputed before the rollout
    (`old_rows`, this micro-batch's rows), or this pass detached (the rollout's first step)."""
    if a.use_rollout_logprobs:
        return rollout_lp.to(logp.device, logp.dtype)
    if old_rows is not None:
        return old_rows[:, : logp.shape[1]].to(logp.device, logp.dtype)
    return logp.detach()


def surrogate(a: AlgorithmConfig, custom_loss, logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor):
    """(loss [n, T], clipped [n, T], ppo_kl [n, T]) of the surrogate algorithm.advantage_estimator selects."""
    if custom_loss is not None:
        return custom_loss(logp, old, adv, mask), torch.zeros_like(logp), old - logp
    if a.advantage_estimator == "gspo":
        return S.gspo_loss(logp, old, adv, mask, a.eps_clip, a.eps_clip_high, a.eps_clip_c)
    if a.advantage_estimator == "cispo":
        return S.cispo_loss(logp, old, adv, a.eps_clip, a.eps_clip_high)
    return L.ppo_clip_loss(logp, old, adv, a.eps_clip, a.eps_clip_high, a.eps_clip_c)


def policy_loss(a: AlgorithmConfig, custom_loss, logp: Tensor, ent: Tensor, old: Tensor, adv: Tensor, mask: Tensor,
                rollout_lp: Optional[Tensor], ref_logp: Callable[[], Tensor], denom: float):
    """One micro-batch: (loss, scalar terms, per-token metrics [n, T]).

    logp, ent: [n, T] with gradients (ent detached unless algorithm.entropy_coef); ref_logp() gives
    the reference's [n, T] log-probs, called only with algorithm.use_kl_loss."""
    mode = a.loss_aggregation
    pg_tok, clipped, ppo_kl = surrogate(a, custom_loss, logp, old, adv, mask)
    per_token = {"pg_clipfrac": clipped, "ppo_kl": ppo_kl}
    if a.use_tis:
        w, per_token["tis_clipfrac"] = S.tis_weights(old, rollout_lp, a.tis_clip_low, a.tis_clip)
        pg_tok = pg_tok * w
    pg_loss = L.aggregate(pg_tok, mask, mode, denom)
    scalars = {"pg_loss": pg_loss}
    per_token["entropy"] = ent
    loss = pg_loss - a.entropy_coef * L.aggregate(ent, mask, mode, denom) if a.entropy_coef else pg_loss
    if a.use_kl_loss:
        ref = ref_logp()
        kl = L.unbiased_kl_estimate(logp, ref, old, a.kl_loss_type) if a.use_unbiased_kl else L.kl_estimate(logp, ref, a.kl_loss_type)
        scalars["kl_loss"] = L.aggregate(kl, mask, mode, denom)
        loss = loss + a.kl_loss_coef * scalars["kl_loss"]
    scalars["loss"] = loss
    if rollout_lp is not None:
        # slime's train_rollout_logprob_abs_diff: the trainer's old log-probs (current ones when they are the rollout's)
        per_token["rollout_logprob_abs_diff"] = ((logp.detach() if a.use_rollout_logprobs else old) - rollout_lp).abs()
    return loss, scalars, per_token
