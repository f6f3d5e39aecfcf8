"""The typed specs that the trainers, the critic and the advantage step receive instead of config groups.

The composition floor (`slime_hydra/app/algorithm.py`) builds them once from `algorithm` and `train`,
turning names into callables there (the surrogate with its clip ε bound, the advantage estimator with
its parameters), so nothing below it branches on an algorithm or estimator name. A spec holds only what
its reader reads; defaults live in the config schema, so every field here is required.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch import Tensor

# surrogate(log_probs [n, T], old_log_probs [n, T], advantages [n, T], mask=mask [n, T]) -> (loss, clipped, ppo_kl), [n, T] each
Surrogate = Callable[..., tuple[Tensor, Tensor, Tensor]]
# objective(spec, log_probs, entropy, old_log_probs, advantages, mask, rollout_log_probs | None, ref_log_probs(),
#           denom) -> (loss, scalar terms, per-token metrics [n, T]): training/policy_loss.py's policy_loss or sft_loss
Objective = Callable[..., tuple[Tensor, dict, dict]]
# tis(pg_loss [n, T], old_log_probs [n, T], rollout_log_probs [n, T], mask [n, T]) -> (pg_loss [n, T], mask [n, T],
#     per-token metrics {name: [n, T]}): TIS (surrogates.truncated_is) or algorithm.custom_tis_function
TisCorrection = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, dict]]
# reducer(pg_loss [n, T], mask [n, T], denom) -> the micro-batch's policy-gradient term: algorithm.custom_pg_loss_reducer_function
PgLossReducer = Callable[[Tensor, Tensor, float], Tensor]
# post_process(samples, group_size) -> one reward per sample for the estimator: reward.custom_reward_post_process
RewardPostProcess = Callable[[list, int], list]
# estimate(rewards [N], mask [N, T], kl [N, T] | None, group_size) -> advantages [N, T]
Estimator = Callable[[Tensor, Tensor, Optional[Tensor], int], Tensor]
# gae(rewards [N], mask [N, T], kl [N, T] | None, values [N, T]) -> (advantages [N, T], returns [N, T])
CriticEstimator = Callable[[Tensor, Tensor, Optional[Tensor], Tensor], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class LossSpec:
    """The policy loss of one micro-batch (training/policy_loss.py) and the KL reference it may need."""

    objective: Objective  # algorithm.loss_type: the whole loss of a micro-batch
    surrogate: Surrogate
    loss_aggregation: str  # algorithms.losses.aggregate's mode
    max_response_len: Optional[int]  # seq_mean_token_sum_norm's constant normalizer
    entropy_coef: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str  # also the estimator of the reward-shaping KL
    use_unbiased_kl: bool
    tis: Optional[TisCorrection]  # None: no truncated importance sampling
    pg_loss_reducer: Optional[PgLossReducer]  # None: loss_aggregation
    use_rollout_logprobs: bool  # old log-probs are the rollout engine's
    keep_reference: bool  # a frozen reference policy (the KL loss or KL reward shaping reads it)
    ref_update_interval: Optional[int]  # re-snapshot the reference every that many rollouts

    def __post_init__(self) -> None:
        if self.loss_aggregation == "seq_mean_token_sum_norm" and not self.max_response_len:
            raise ValueError("algorithm.loss_aggregation=seq_mean_token_sum_norm needs LossSpec(max_response_len="
                             "rollout.rollout_max_response_len)")


@dataclass(frozen=True)
class OptimSpec:
    """AdamW, its learning-rate schedule over `total_steps` optimizer steps, and gradient clipping."""

    lr: float
    min_lr: float
    lr_decay_style: str
    lr_warmup_iters: int
    total_steps: int
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    adam_impl: str
    clip_grad: float  # <= 0: no clipping


@dataclass(frozen=True)
class BatchSpec:
    """How a rollout's samples become optimizer steps and micro-batches. A trainer's step is its batch's
    samples / num_steps_per_rollout (a data-parallel rank's share of train.global_batch_size)."""

    num_steps_per_rollout: int
    micro_batch_size: int
    skip_zero_advantage_samples: bool
    prefix_sharing: bool  # train.backend=torch: each distinct prompt runs once per micro-batch
    # train.use_dynamic_batch_size: the token budgets of the train pass and of the forward-only passes (log-probs,
    # reference, values); None: micro-batches of micro_batch_size samples
    max_tokens_per_gpu: Optional[int]
    log_probs_max_tokens_per_gpu: Optional[int]
    qkv_format: str  # train.qkv_format: bshd (padded rows) | thd (a micro-batch packed into one row, training/thd.py)


@dataclass(frozen=True)
class CriticSpec:
    """PPO's value model: its own optimizer, the value-loss clip, and the rollouts it trains alone."""

    optim: OptimSpec
    value_clip: float
    num_critic_only_steps: int


@dataclass(frozen=True)
class AdvantageSpec:
    """The advantage step: `estimate` for critic-free estimators, or `gae` over the critic's values (ppo).
    shaping_kl: the trainer's KL(pi_old || ref) is computed for reward shaping (algorithm.kl_coef != 0)."""

    estimate: Optional[Estimator]
    gae: Optional[CriticEstimator]
    shaping_kl: bool
    reward_post_process: Optional[RewardPostProcess]  # None: the estimator reads the samples' rewards

    def __post_init__(self) -> None:
        if (self.estimate is None) == (self.gae is None):
            raise ValueError("AdvantageSpec needs exactly one of estimate and gae")


@dataclass(frozen=True)
class RankHooks:
    """slime's megatron hooks (train.custom_megatron_*), called on every train rank of train.backend=megatron; None: none."""

    init: Optional[Callable[[], None]]  # once the process groups exist, before the models
    before_log_prob: Optional[Callable[[list, str], None]]  # (model chunks, store_prefix) before a forward-only log-prob pass
    before_train_step: Optional[Callable[[int, int, list, object], None]]  # (rollout_id, step_id, model chunks, optimizer)


@dataclass(frozen=True)
class AlgorithmSpecs:
    """Everything app/algorithm.py builds for one run: the trainer's specs and the advantage step's."""

    loss: LossSpec
    optim: OptimSpec
    batch: BatchSpec
    critic: Optional[CriticSpec]  # None: no value model
    advantage: AdvantageSpec
    hooks: RankHooks
