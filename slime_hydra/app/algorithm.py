"""algorithm (+ train) -> the typed specs the trainers, the critic and the advantage step receive.

This is where an algorithm's names become objects, once: `advantage_estimator` names a row of
`algorithms/estimators.ESTIMATORS`, whose surrogate (its clip ε bound with functools.partial) and advantage
function (its keys bound) go into the specs, and whose `critic` gives a CriticSpec; `custom_loss` /
`custom_advantage` plug-ins replace the surrogate / the estimator. Nothing here or below compares an estimator's
name: the row says what it is. The config was validated before this runs.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

from slime_hydra.algorithms import advantages as A
from slime_hydra.algorithms import surrogates as S
from slime_hydra.algorithms.estimators import ESTIMATORS, bind
from slime_hydra.app.plugins import load_target
from slime_hydra.config.schema import AlgorithmConfig, RunConfig, TrainConfig
from slime_hydra.training.microbatch import budgets
from slime_hydra.training.policy_loss import policy_loss, sft_loss
from slime_hydra.training.specs import (
    AdvantageSpec,
    AlgorithmSpecs,
    BatchSpec,
    CriticSpec,
    LossSpec,
    OptimSpec,
    RankHooks,
    Surrogate,
)


def algorithm_specs(a: AlgorithmConfig, train: TrainConfig, total_steps: int,
                    max_response_len: Optional[int] = None, reward_post_process: Optional[dict] = None) -> AlgorithmSpecs:
    """All specs of one run; total_steps = num_rollout × train.num_steps_per_rollout (the lr schedule's horizon),
    max_response_len = rollout.rollout_max_response_len (seq_mean_token_sum_norm's normalizer), reward_post_process =
    reward.custom_reward_post_process (the advantage step's)."""
    return AlgorithmSpecs(loss_spec(a, max_response_len), optim_spec(train, total_steps), batch_spec(train),
                          critic_spec(a, train, total_steps), advantage_spec(a, reward_post_process), rank_hooks(train))


def rank_hooks(t: TrainConfig) -> RankHooks:
    return RankHooks(init=load_target(t.custom_megatron_init), before_log_prob=load_target(t.custom_megatron_before_log_prob_hook),
                     before_train_step=load_target(t.custom_megatron_before_train_step_hook))


def run_specs(cfg: RunConfig) -> AlgorithmSpecs:
    """The specs of a validated run (its batch identity resolved: train.num_steps_per_rollout is set)."""
    return algorithm_specs(cfg.algorithm, cfg.train, cfg.num_rollout * cfg.train.num_steps_per_rollout,
                           cfg.rollout.rollout_max_response_len, cfg.reward.custom_reward_post_process)


def surrogate(a: AlgorithmConfig) -> Surrogate:
    """The policy surrogate with its clip range bound: algorithm.custom_loss, else the estimator's row's
    (PPO-clip unless the row names another, as gspo and cispo do)."""
    custom = load_target(a.custom_loss)
    if custom is not None:
        return partial(S.plugin_surrogate, fn=custom)
    row = ESTIMATORS[a.advantage_estimator]
    return bind(row.surrogate, row.surrogate_keys, a)


OBJECTIVES = {"policy_loss": policy_loss, "custom_loss": policy_loss, "sft_loss": sft_loss}  # algorithm.loss_type


def loss_spec(a: AlgorithmConfig, max_response_len: Optional[int] = None) -> LossSpec:
    """custom_loss is the policy loss with algorithm.custom_loss as its surrogate (config/checks_algorithm.py requires it)."""
    return LossSpec(
        objective=OBJECTIVES[a.loss_type], surrogate=surrogate(a), loss_aggregation=a.loss_aggregation, max_response_len=max_response_len,
        entropy_coef=a.entropy_coef, use_kl_loss=a.use_kl_loss, kl_loss_coef=a.kl_loss_coef, kl_loss_type=a.kl_loss_type,
        use_unbiased_kl=a.use_unbiased_kl,
        tis=tis_correction(a), pg_loss_reducer=load_target(a.custom_pg_loss_reducer_function),
        use_rollout_logprobs=a.use_rollout_logprobs, keep_reference=a.use_kl_loss or a.kl_coef != 0,
        ref_update_interval=a.ref_update_interval)


def tis_correction(a: AlgorithmConfig):
    """use_tis: algorithm.custom_tis_function, else slime's vanilla TIS with its clip band bound."""
    if not a.use_tis:
        return None
    return load_target(a.custom_tis_function) or partial(S.truncated_is, tis_clip_low=a.tis_clip_low, tis_clip=a.tis_clip)


def optim_spec(t: TrainConfig, total_steps: int) -> OptimSpec:
    return OptimSpec(lr=t.lr, min_lr=t.min_lr, lr_decay_style=t.lr_decay_style, lr_warmup_iters=t.lr_warmup_iters,
                     total_steps=total_steps, weight_decay=t.weight_decay, adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2,
                     adam_eps=t.adam_eps, adam_impl=t.adam_impl, clip_grad=t.clip_grad)


def batch_spec(t: TrainConfig) -> BatchSpec:
    max_tokens, log_probs_max_tokens = budgets(t.use_dynamic_batch_size, t.max_tokens_per_gpu, t.log_probs_max_tokens_per_gpu)
    return BatchSpec(num_steps_per_rollout=t.num_steps_per_rollout, micro_batch_size=t.micro_batch_size,
                     skip_zero_advantage_samples=t.skip_zero_advantage_samples, prefix_sharing=t.prefix_sharing,
                     max_tokens_per_gpu=max_tokens, log_probs_max_tokens_per_gpu=log_probs_max_tokens,
                     qkv_format=t.qkv_format)


def critic_spec(a: AlgorithmConfig, t: TrainConfig, total_steps: int) -> Optional[CriticSpec]:
    """The value model of a critic estimator (ppo): train.critic_lr (None: train.lr), train.min_lr scaled by the same factor."""
    if not ESTIMATORS[a.advantage_estimator].critic:
        return None
    lr = t.critic_lr if t.critic_lr is not None else t.lr
    min_lr = t.min_lr * lr / t.lr if t.lr > 0 else 0.0
    optim = OptimSpec(lr=lr, min_lr=min_lr, lr_decay_style=t.lr_decay_style, lr_warmup_iters=t.lr_warmup_iters,
                      total_steps=total_steps, weight_decay=t.weight_decay, adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2,
                      adam_eps=t.adam_eps, adam_impl=t.adam_impl, clip_grad=t.clip_grad)
    return CriticSpec(optim=optim, value_clip=a.value_clip, num_critic_only_steps=a.num_critic_only_steps)


def advantage_spec(a: AlgorithmConfig, reward_post_process: Optional[dict] = None) -> AdvantageSpec:
    """The row's advantage function with its keys bound (whitened with normalize_advantages), or a critic
    estimator's GAE over the critic's values (which whitens itself)."""
    row, shaping_kl, post = ESTIMATORS[a.advantage_estimator], a.kl_coef != 0, load_target(reward_post_process)
    if row.critic:
        return AdvantageSpec(estimate=None, gae=bind(row.advantage, row.advantage_keys, a), shaping_kl=shaping_kl,
                             reward_post_process=post)
    custom = load_target(a.custom_advantage)
    est = partial(A.plugin_estimator, fn=custom) if custom is not None else bind(row.advantage, row.advantage_keys, a)
    if a.normalize_advantages:
        est = partial(A.whitened, estimator=est)
    return AdvantageSpec(estimate=est, gae=None, shaping_kl=shaping_kl, reward_post_process=post)
