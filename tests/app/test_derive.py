"""Derivation returns a new config and leaves the given one as it was; the checks after it only read."""

from __future__ import annotations

import copy

from slime_hydra.app.checks import check
from slime_hydra.app.derive import derive
from slime_hydra.config.compose import Composer, check_overrides, to_run_config


def given(overrides: list[str]):
    """The typed config as composed, before derivation."""
    with Composer() as composer:
        cfg, problems = check_overrides(composer, overrides)
    assert cfg is not None and problems == [], problems
    return to_run_config(cfg)


def test_derive_fills_values_worked_out_by_hand_into_a_new_config():
    # 8 prompts × 4 samples = 32 per rollout; 2 steps -> global batch 16; two data-parallel Ray ranks -> micro 16 / 2 = 8;
    # one sample per prompt is not it (4), so std normalization stays; async turns the rollout's log-probs on
    cfg = given(["rollout.rollout_batch_size=8", "rollout.n_samples_per_prompt=4", "train.num_steps_per_rollout=2",
                 "train.global_batch_size=null", "train.micro_batch_size=null", "cluster.backend=ray",
                 "cluster.actor_num_gpus_per_node=2", "cluster.colocate=true", "train_mode=async"])
    out, notes = derive(cfg)
    assert out is not cfg and out.train is not cfg.train and out.algorithm is not cfg.algorithm
    t = out.train
    assert (t.global_batch_size, t.num_steps_per_rollout, t.micro_batch_size) == (16, 2, 8)
    # colocated: the engines release their memory while the trainer trains; the trainer not while they generate, which
    # under async is while it trains
    assert out.cluster.rollout_num_gpus == 2 and out.cluster.offload_train is False and out.cluster.offload_rollout is True
    assert out.rollout.over_sampling_batch_size == 8  # null: the rollout batch
    assert out.algorithm.use_rollout_logprobs is True and out.algorithm.grpo_std_normalization is True
    assert out.model.model_impl == "native"  # auto: the tiny dense qwen3 runs natively
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size, cfg.cluster.rollout_num_gpus) == (None, None, None)
    assert cfg.algorithm.use_rollout_logprobs is False and cfg.model.model_impl == "auto"
    assert any(n.startswith("batch: ") and "= 16 × 2 (train.micro_batch_size=8)" in n for n in notes), notes
    assert derive(out)[0] == out  # a derived config derives to itself


def test_check_leaves_the_callers_config_and_its_groups_unchanged():
    # a group of one sample turns std normalization off, a KL loss turns zero-advantage skipping off, num_epoch gives
    # num_rollout: all in the derived config, none in the given one
    cfg = given(["algorithm=reinforce_plus_plus", "rollout.n_samples_per_prompt=1", "rollout.rollout_batch_size=8",
                 "train.micro_batch_size=8", "train.skip_zero_advantage_samples=true", "algorithm.use_kl_loss=true",
                 "algorithm.kl_loss_coef=0.01", "num_rollout=null", "num_epoch=1"])
    before, groups = copy.deepcopy(cfg), {name: id(getattr(cfg, name)) for name in ("algorithm", "train", "model")}
    out, problems, notes = check(cfg)
    assert problems == [], problems
    assert cfg == before and {name: id(getattr(cfg, name)) for name in groups} == groups
    assert cfg.algorithm.grpo_std_normalization is True and out.algorithm.grpo_std_normalization is False
    assert cfg.train.skip_zero_advantage_samples is True and out.train.skip_zero_advantage_samples is False
    assert cfg.num_rollout is None and out.num_rollout == 1 * 7900 // 8  # the shipped training set: 7,900 prompts


def test_a_value_that_cannot_be_derived_is_left_unset_for_the_checks_to_name():
    cfg = given(["rollout.rollout_batch_size=8", "rollout.n_samples_per_prompt=4", "train.num_steps_per_rollout=3",
                 "train.global_batch_size=null"])
    out, _ = derive(cfg)
    assert out.train.global_batch_size is None and out.train.num_steps_per_rollout == 3
    _, problems, _ = check(cfg)
    assert any("= 32 is not divisible by train.num_steps_per_rollout=3" in p for p in problems), problems
    _, problems, _ = check(given(["num_rollout=5", "num_epoch=2"]))
    assert any("num_rollout=5 and num_epoch=2 are both set" in p for p in problems), problems


def test_offload_follows_colocation_and_the_train_mode():
    """Unset: the trainer is released while colocated engines generate (slime's default) unless train_mode=async, which
    trains while they generate; the engines release theirs whenever colocated; a value given is kept."""
    derived = {mode: derive(given(["cluster.colocate=true", f"train_mode={mode}"]))[0].cluster for mode in ("sync", "async")}
    assert (derived["sync"].offload_train, derived["sync"].offload_rollout) == (True, True)
    assert (derived["async"].offload_train, derived["async"].offload_rollout) == (False, True)
    apart = derive(given(["cluster.colocate=false", "cluster.rollout_num_gpus=1"]))[0].cluster
    assert (apart.offload_train, apart.offload_rollout) == (False, False)
    kept = derive(given(["cluster.colocate=true", "cluster.offload_train=false"]))[0].cluster
    assert kept.offload_train is False
