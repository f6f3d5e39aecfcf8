"""The per-micro-batch policy loss both trainers compose (train=torch and train=megatron).

A backend computes the log-probs and entropy of one micro-batch its own way (full logits in
torch; vocab-parallel, chunked in megatron) and hands them here; everything after that (old
log-probs, surrogate, TIS, aggregation, entropy bonus, KL loss, metrics) is this one function.
Scalars are divided by the whole step's `denom`, so they sum exactly over micro-batches.
The surrogate (PPO-clip, GSPO, CISPO or algorithm.custom_loss, its clip ε bound), the TIS correction
(or algorithm.custom_tis_function) and a custom pg-loss reducer come as callables in the LossSpec; nothing here knows an algorithm's name. `sft_loss` is the other objective a
LossSpec may hold (algorithm.loss_type=sft_loss): the response tokens' negative log-likelihood.
"""

from __future__ import annotations

from typing import Callable, Optional

from torch import Tensor

from slime_hydra.algorithms import losses as L
from slime_hydra.training.specs import LossSpec


def old_log_probs(spec: LossSpec, logp: Tensor, rollout_lp: Optional[Tensor], old_rows: Optional[Tensor]) -> Tensor:
    """[n, T] old log-probs: the rollout's (use_rollout_logprobs), recomputed before the rollout
    (`old_rows`, this micro-batch's rows), or this pass detached (the rollout's first step)."""
    if spec.use_rollout_logprobs:
        return rollout_lp.to(logp.device, logp.dtype)
    if old_rows is not None:
        return old_rows[:, : logp.shape[1]].to(logp.device, logp.dtype)
    return logp.detach()


def policy_loss(spec: LossSpec, logp: Tensor, ent: Tensor, old: Tensor, adv: Tensor, mask: Tensor,
                rollout_lp: Optional[Tensor], ref_logp: Callable[[], Tensor], denom: float):
    """One micro-batch: (loss, scalar terms, per-token metrics [n, T]).

    logp, ent: [n, T] with gradients (ent detached unless entropy_coef); ref_logp() gives the
    reference's [n, T] log-probs, called only with use_kl_loss."""
    mode = spec.loss_aggregation
    pg_tok, clipped, ppo_kl = spec.surrogate(logp, old, adv, mask=mask)
    per_token = {"pg_clipfrac": clipped, "ppo_kl": ppo_kl}
    kept = mask
    if spec.tis is not None:  # TIS or algorithm.custom_tis_function
        pg_tok, kept, more = spec.tis(pg_tok, old, rollout_lp, mask)
        per_token |= more
        pg_tok = pg_tok * kept  # a token it rejects leaves the numerator; the denominators stay the loss mask's (slime's)
    pg_loss = spec.pg_loss_reducer(pg_tok, kept, denom) if spec.pg_loss_reducer else L.aggregate(pg_tok, mask, mode, denom)
    scalars = {"pg_loss": pg_loss}
    per_token["entropy"] = ent
    loss = pg_loss - spec.entropy_coef * L.aggregate(ent, mask, mode, denom) if spec.entropy_coef else pg_loss
    if spec.use_kl_loss:
        ref = ref_logp()
        kl = (L.unbiased_kl_estimate(logp, ref, old, spec.kl_loss_type) if spec.use_unbiased_kl
              else L.kl_estimate(logp, ref, spec.kl_loss_type))
        scalars["kl_loss"] = L.aggregate(kl, mask, mode, denom)
        loss = loss + spec.kl_loss_coef * scalars["kl_loss"]
    scalars["loss"] = loss
    if rollout_lp is not None:
        # slime's train_rollout_logprob_abs_diff: the trainer's old log-probs (current ones when they are the rollout's)
        per_token["rollout_logprob_abs_diff"] = ((logp.detach() if spec.use_rollout_logprobs else old) - rollout_lp).abs()
    return loss, scalars, per_token


def sft_loss(spec: LossSpec, logp: Tensor, ent: Tensor, old: Tensor, adv: Tensor, mask: Tensor,
             rollout_lp: Optional[Tensor], ref_logp: Callable[[], Tensor], denom: float):
    """algorithm.loss_type=sft_loss (slime's): the negative log-likelihood of the loss-mask tokens, aggregated as the
    policy loss is (loss_aggregation over the step's `denom`). Advantages, old log-probs and the reference are not
    read: the samples are trained on as they are, whatever their reward."""
    loss = L.aggregate(L.sft_token_loss(logp), mask, spec.loss_aggregation, denom)
    return loss, {"loss": loss}, {"entropy": ent}
