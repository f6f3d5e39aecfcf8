"""Checks of the algorithm group: slime's assertions on KL, TIS and critic settings, each problem naming the key
and the fix. Pure checks over the typed config; config/checks.py calls them. What depends on the estimator (its
name, group baseline, critic, shaped KL, whitening) is checked beside the estimator table, in algorithms/checks.py."""

from __future__ import annotations

from slime_hydra.config.plugins import check_target
from slime_hydra.config.schema import RunConfig


def check_algorithm(cfg: RunConfig, problems: list[str]) -> None:
    """slime's algorithm assertions (slime_validate_args), each naming the key and the fix."""
    a = cfg.algorithm
    if a.kl_coef != 0 and a.kl_loss_coef != 0:
        problems.append(f"algorithm.kl_coef={a.kl_coef} (KL as reward shaping) and algorithm.kl_loss_coef={a.kl_loss_coef} (KL as a loss "
                        "term) are both non-zero; slime allows only one: set algorithm.kl_coef=0 or algorithm.kl_loss_coef=0")
    if a.use_tis and a.use_rollout_logprobs:
        problems.append("algorithm.use_tis=true and algorithm.use_rollout_logprobs=true are exclusive (TIS reweights recomputed old "
                        "log-probs towards the rollout's); set algorithm.use_rollout_logprobs=false or algorithm.use_tis=false")
    if a.tis_clip <= a.tis_clip_low:
        problems.append(f"algorithm.tis_clip={a.tis_clip} must be > algorithm.tis_clip_low={a.tis_clip_low}; "
                        f"set algorithm.tis_clip above {a.tis_clip_low} (slime's default is 2.0)")
    if a.use_unbiased_kl and not a.use_kl_loss:
        problems.append("algorithm.use_unbiased_kl=true has no effect without algorithm.use_kl_loss=true; set it or set "
                        "algorithm.use_unbiased_kl=false")
    for key, lo, hi in (("gamma", 0.0, 1.0), ("lambd", 0.0, 1.0)):
        if not lo <= getattr(a, key) <= hi:
            problems.append(f"algorithm.{key}={getattr(a, key)} must be in [{lo}, {hi}]")
    if a.value_clip <= 0:
        problems.append(f"algorithm.value_clip={a.value_clip} must be > 0")
    check_critic(cfg, problems)
    if a.ref_update_interval is not None:
        if a.ref_update_interval < 1:
            problems.append(f"algorithm.ref_update_interval={a.ref_update_interval} must be >= 1 or null")
        elif not (a.use_kl_loss or a.kl_coef != 0):
            problems.append(f"algorithm.ref_update_interval={a.ref_update_interval} has no reference model to update (no KL is "
                            "used); set algorithm.use_kl_loss=true with algorithm.kl_loss_coef, or algorithm.ref_update_interval=null")
    check_target("algorithm.custom_advantage", a.custom_advantage, 4, problems)
    check_target("algorithm.custom_loss", a.custom_loss, 4, problems)
    check_loss_type(a, problems)


def check_loss_type(a, problems: list[str]) -> None:
    """custom_loss needs the function; sft_loss reads neither it, the KL loss nor the entropy bonus."""
    if a.loss_type == "custom_loss" and not a.custom_loss:
        problems.append("algorithm.loss_type=custom_loss needs algorithm.custom_loss (a `_target_` node: fn(log_probs, "
                        "old_log_probs, advantages, mask) -> per-token loss); set it, or algorithm.loss_type=policy_loss")
    if a.loss_type == "sft_loss":
        unread = [k for k, on in (("algorithm.custom_loss", bool(a.custom_loss)), ("algorithm.use_kl_loss", a.use_kl_loss),
                                  ("algorithm.entropy_coef", a.entropy_coef != 0)) if on]
        if unread:
            problems.append(f"algorithm.loss_type=sft_loss trains on the response tokens' negative log-likelihood alone: "
                            f"{', '.join(unread)} would be ignored; unset {' and '.join(unread)}, or "
                            "algorithm.loss_type=policy_loss")


def check_critic(cfg: RunConfig, problems: list[str]) -> None:
    """The critic's own ranges (whether the estimator has a critic is algorithms/checks.py's)."""
    a, t = cfg.algorithm, cfg.train
    if a.num_critic_only_steps < 0:
        problems.append(f"algorithm.num_critic_only_steps={a.num_critic_only_steps} must be >= 0")
    if t.critic_lr is not None and t.critic_lr <= 0:
        problems.append(f"train.critic_lr={t.critic_lr} must be > 0 (or null: train.lr)")
