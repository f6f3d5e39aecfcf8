"""The algorithm options through the real TorchTrainBackend on a tiny float64 model.

Invariance: a step of 8 samples as 8 micro-batches of 1 gives the same gradient as 1 micro-batch
of 8, for every loss aggregation mode and surrogate (the denominators are the whole step's, so the
micro-batch losses sum exactly). First step of a rollout: ppo_kl is exactly 0 (slime's CI check).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from slime_hydra.algorithms.losses import aggregate
from slime_hydra.config.schema import AlgorithmConfig, TrainConfig
from slime_hydra.training.torch_backend import TorchTrainBackend
from tests.support.tiny import CASES, CPU, MAX_LEN, base_model, make_batch
from tests.support.trainers import torch_backend


def backend(algo: AlgorithmConfig, mbs: int, gbs: int = 8, steps: int = 1, skip: bool = True, lr: float = 1e-3,
            adam_impl: str = "fused") -> TorchTrainBackend:
    # prefix_sharing off: these invariances are about micro-batching, to float64 round-off; sharing merges rows
    # before transformers' float32 RMSNorm (~1e-7), and tests/training/test_prefix.py checks it against this path
    train = TrainConfig(micro_batch_size=mbs, global_batch_size=gbs, num_steps_per_rollout=steps, lr=lr, clip_grad=0.0,
                        skip_zero_advantage_samples=skip, prefix_sharing=False, adam_impl=adam_impl)
    b = torch_backend(base_model(), algo, train, temperature=1.0, total_steps=10, device=CPU, max_response_len=MAX_LEN)
    b.freeze_reference()
    return b


@pytest.mark.parametrize("case", list(CASES))
def test_micro_batch_1x8_equals_8x1(case):
    algo = AlgorithmConfig(**CASES[case])
    skip = not (algo.use_kl_loss or algo.entropy_coef)  # as validation derives it
    batch = make_batch(algo.advantage_estimator, grpo_std_normalization=algo.grpo_std_normalization,
                       normalize_advantages=algo.normalize_advantages)
    one, eight = backend(algo, mbs=1, skip=skip), backend(algo, mbs=8, skip=skip)
    m1, m8 = one.train_rollout(batch), eight.train_rollout(batch)
    grads = 0
    for (name, p1), (_, p8) in zip(one.model.named_parameters(), eight.model.named_parameters()):
        assert_close(p1.grad, p8.grad, rtol=1e-9, atol=1e-13, msg=lambda m: f"{case} {name}: {m}")
        assert_close(p1, p8, rtol=1e-9, atol=1e-13)
        grads += int(p1.grad.abs().sum() > 0)
    assert grads > 0  # the step did train
    for key in ("train/loss", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl", "train/entropy"):
        assert abs(m1[key] - m8[key]) < 1e-9 * max(1.0, abs(m8[key])), (case, key, m1[key], m8[key])
    if algo.use_tis:
        assert abs(m1["train/tis_clipfrac"] - m8["train/tis_clipfrac"]) < 1e-12 and "train/tis_clipfrac" in m8
    else:
        assert "train/tis_clipfrac" not in m8
    # the agreeing group 3 has zero advantages and is left out, unless whitening shifted its zeros to -mean/std
    assert m8["train/kept_samples"] == (6.0 if skip and not algo.normalize_advantages else 8.0)


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "cispo"])
def test_first_step_ppo_kl_is_exactly_zero(estimator):
    # 2 optimizer steps of 4 samples; the first step's old log-probs are its own forward pass, detached
    algo = AlgorithmConfig(advantage_estimator=estimator, use_tis=True)
    b = backend(algo, mbs=2, gbs=4, steps=2, skip=False, lr=1e-2)
    per_step = []
    inner = b._train_step
    b._train_step = lambda *a: per_step.append(inner(*a)) or per_step[-1]
    b.train_rollout(make_batch(estimator))
    assert per_step[0]["train/ppo_kl"] == 0.0
    assert per_step[0]["train/pg_clipfrac"] == 0.0
    # the second step's samples use the log-probs recomputed before the update: now they differ
    assert per_step[1]["train/ppo_kl"] != 0.0
    assert 0.0 <= per_step[0]["train/tis_clipfrac"] <= 1.0


def test_use_rollout_logprobs_makes_the_rollout_log_probs_old():
    # old = rollout log-probs -> ppo_kl = rollout - new; the abs-diff metric compares the current ones
    algo = AlgorithmConfig(use_rollout_logprobs=True)
    b = backend(algo, mbs=8, skip=False)
    batch = make_batch()
    new = b.compute_log_probs(batch).double()
    m = b.train_rollout(batch)
    mask = batch.loss_mask.double()
    rollout = batch.rollout_log_probs.double()
    assert abs(m["train/ppo_kl"] - aggregate(rollout - new, mask, "sample_token_mean", 8.0).item()) < 1e-6
    assert abs(m["train/rollout_logprob_abs_diff"] - aggregate((new - rollout).abs(), mask, "sample_token_mean", 8.0).item()) < 1e-6


def test_custom_loss_plugin_replaces_the_surrogate():
    # -A log pi has CISPO's gradient on a first step (ratio 1, inside any band): the same update
    custom = AlgorithmConfig(custom_loss={"_target_": "tests.support.plugins.reinforce_surrogate", "scale": 1.0})
    cispo = AlgorithmConfig(advantage_estimator="cispo", eps_clip=1.0, eps_clip_high=4.0)
    a, c = backend(custom, mbs=4, skip=False), backend(cispo, mbs=4, skip=False)
    batch = make_batch()
    a.train_rollout(batch), c.train_rollout(batch)
    for p1, p2 in zip(a.model.parameters(), c.model.parameters()):
        assert_close(p1.grad, p2.grad, rtol=1e-9, atol=1e-13)


def test_reward_kl_is_zero_against_an_identical_reference():
    b = backend(AlgorithmConfig(advantage_estimator="reinforce_plus_plus", kl_coef=0.1, normalize_advantages=True), mbs=4)
    batch = make_batch()
    assert b.ref_model is not None  # kl_coef != 0 needs the reference, like use_kl_loss
    assert b.reward_kl(batch).abs().max().item() == 0.0
    b.train_rollout(batch)  # one update moves the policy away from the reference
    kl = b.reward_kl(batch)
    assert (kl * (1 - batch.loss_mask)).abs().max() == 0 and kl.abs().max() > 0


def test_seq_mean_token_sum_norm_needs_max_response_len():
    train = TrainConfig(micro_batch_size=1, global_batch_size=8, num_steps_per_rollout=1)
    with pytest.raises(ValueError, match="max_response_len"):
        torch_backend(base_model(), AlgorithmConfig(loss_aggregation="seq_mean_token_sum_norm"), train, 1.0, 1, CPU)


@pytest.mark.integration
def test_adam_impls_take_the_same_steps():
    """train.adam_impl=fused | foreach | for_loop: one AdamW, three implementations; two rollouts of training
    give the same weights to float64 rounding (and the steps did move them)."""
    batch = make_batch()
    start = torch.cat([p.detach().flatten() for p in base_model().parameters()])
    out = {}
    for impl in ("for_loop", "foreach", "fused"):
        b = backend(AlgorithmConfig(), mbs=8, adam_impl=impl)
        assert (b.optimizer.defaults["fused"], b.optimizer.defaults["foreach"]) == (impl == "fused", impl == "foreach")
        b.train_rollout(batch)
        b.train_rollout(batch)
        out[impl] = torch.cat([p.detach().flatten() for p in b.model.parameters()])
    assert (out["for_loop"] - start).abs().max() > 1e-4
    assert_close(out["foreach"], out["for_loop"], rtol=0, atol=1e-12)
    assert_close(out["fused"], out["for_loop"], rtol=0, atol=1e-12)
