"""The algorithm options compose to slime's settings, and bad combinations fail naming the key and the fix."""

from __future__ import annotations

import pytest

from slime_hydra.app.checks import check
from slime_hydra.app.preflight import check_composed, compose_run
from slime_hydra.config.compose import Composer, check_overrides
from tests.support.runs import problems_of


def notes_of(overrides: list[str]) -> list[str]:
    return check(compose_run(overrides))[2]


@pytest.mark.parametrize("option,expected", [
    ("grpo", dict(advantage_estimator="grpo", loss_aggregation="sample_token_mean", grpo_std_normalization=True)),
    ("dr_grpo", dict(grpo_std_normalization=False, loss_aggregation="seq_mean_token_sum_norm")),
    ("gspo", dict(advantage_estimator="gspo", eps_clip=3e-4, eps_clip_high=4e-4)),
    ("cispo", dict(advantage_estimator="cispo", eps_clip=1.0, eps_clip_high=4.0)),
    ("dapo", dict(advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.28, loss_aggregation="token_mean")),
    ("rloo", dict(advantage_estimator="rloo", rewards_normalization=True, normalize_advantages=False, kl_coef=0.0)),
    ("reinforce_plus_plus", dict(advantage_estimator="reinforce_plus_plus", normalize_advantages=True)),
    ("reinforce_plus_plus_baseline", dict(advantage_estimator="reinforce_plus_plus_baseline", normalize_advantages=True)),
    ("ppo", dict(advantage_estimator="ppo", normalize_advantages=True, value_clip=0.2, gamma=1.0, lambd=1.0,
                 num_critic_only_steps=0)),
])
def test_algorithm_options(option, expected):
    a = compose_run([f"algorithm={option}"]).algorithm
    assert a.name == option
    for key, value in expected.items():
        assert getattr(a, key) == value, (option, key)


def test_slime_defaults():
    a = compose_run([]).algorithm
    assert (a.kl_coef, a.use_unbiased_kl, a.normalize_advantages, a.gamma, a.lambd, a.value_clip) == (0.0, False, False, 1.0, 1.0, 0.2)
    assert (a.use_tis, a.tis_clip, a.tis_clip_low, a.use_rollout_logprobs) == (False, 2.0, 0.0, False)
    assert not a.custom_advantage and not a.custom_loss  # empty: none


def test_kl_coef_and_kl_loss_coef_are_exclusive():
    probs = problems_of(["algorithm=reinforce_plus_plus", "algorithm.kl_coef=0.01", "algorithm.use_kl_loss=true",
                         "algorithm.kl_loss_coef=0.01"])
    (msg,) = [p for p in probs if "algorithm.kl_coef" in p]
    assert "algorithm.kl_loss_coef=0.01" in msg and "set algorithm.kl_coef=0 or algorithm.kl_loss_coef=0" in msg


def test_kl_coef_has_no_effect_on_the_grpo_family():
    (msg,) = problems_of(["algorithm.kl_coef=0.01"])
    assert "advantage_estimator=grpo" in msg and "algorithm.use_kl_loss=true" in msg
    (msg,) = problems_of(["algorithm=rloo", "algorithm.kl_coef=0.01"])  # rloo's outcome advantages ignore it too
    assert "advantage_estimator=rloo" in msg and "algorithm.use_kl_loss=true" in msg


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_reinforce_plus_plus_needs_normalize_advantages(estimator):
    (msg,) = problems_of([f"algorithm.advantage_estimator={estimator}"])
    assert f"algorithm.advantage_estimator={estimator}" in msg and "algorithm.normalize_advantages=true" in msg


def test_use_tis_and_use_rollout_logprobs_are_exclusive():
    (msg,) = problems_of(["algorithm.use_tis=true", "algorithm.use_rollout_logprobs=true"])
    assert "algorithm.use_tis=true" in msg and "algorithm.use_rollout_logprobs=true" in msg and "set algorithm." in msg


def test_tis_clip_must_exceed_tis_clip_low():
    (msg,) = problems_of(["algorithm.use_tis=true", "algorithm.tis_clip=0.5", "algorithm.tis_clip_low=0.5"])
    assert "algorithm.tis_clip=0.5 must be > algorithm.tis_clip_low=0.5" in msg


def test_cispo_with_a_lower_bound_is_a_note_not_an_error():
    notes = notes_of(["algorithm=cispo", "algorithm.eps_clip=0.2"])
    assert any("algorithm.advantage_estimator=cispo" in n and "eps_clip=1.0" in n for n in notes)
    assert not any("cispo" in n for n in notes_of(["algorithm=cispo"]))


def test_unbiased_kl_needs_the_kl_loss():
    (msg,) = problems_of(["algorithm.use_unbiased_kl=true"])
    assert "algorithm.use_kl_loss=true" in msg


def test_new_estimators_and_aggregations_are_choices():
    (msg,) = problems_of(["algorithm.advantage_estimator=gae"])
    assert "reinforce_plus_plus_baseline" in msg and "'ppo'" in msg
    (msg,) = problems_of(["algorithm.loss_aggregation=seq_mean"])
    assert "seq_mean_token_sum_norm" in msg


@pytest.mark.parametrize("option", ["gspo", "rloo"])
def test_group_baseline_estimators_need_two_samples(option):
    probs = problems_of([f"algorithm={option}", "rollout.n_samples_per_prompt=1"])
    assert any(f"{option}'s group baseline" in p and "n_samples_per_prompt>=2" in p for p in probs)


def test_custom_plugins_are_bound_at_validation():
    ok = compose_run(["++algorithm.custom_loss={_target_:tests.support.plugins.reinforce_surrogate,scale:2.0}"])
    assert ok.algorithm.custom_loss["scale"] == 2.0
    assert not ok.train.skip_zero_advantage_samples  # a custom loss may depend on zero-advantage samples
    probs = problems_of(["++algorithm.custom_advantage={_target_:tests.support.plugins.no_such_fn}",
                         "++algorithm.custom_loss={_target_:tests.support.plugins.reinforce_surrogate,nope:1}"])
    assert any(p.startswith("algorithm.custom_advantage._target_=") and "does not import" in p for p in probs), probs
    assert any(p.startswith("algorithm.custom_loss._target_=") and "4 positional" in p for p in probs), probs


def test_ppo_combinations_name_the_fix():
    (msg,) = problems_of(["algorithm=ppo", "++algorithm.custom_advantage={_target_:tests.support.plugins.reinforce_surrogate}"])
    assert "algorithm.custom_advantage" in msg and "GAE" in msg
    (msg,) = problems_of(["algorithm.num_critic_only_steps=2"])
    assert "algorithm=ppo" in msg
    (msg,) = problems_of(["algorithm=ppo", "algorithm.num_critic_only_steps=5", "num_rollout=5"])
    assert "below num_rollout" in msg
    (msg,) = problems_of(["algorithm=ppo", "train.critic_lr=0"])
    assert "train.critic_lr=0" in msg


def test_ref_update_interval_needs_a_reference():
    (msg,) = problems_of(["algorithm.ref_update_interval=10"])
    assert "algorithm.use_kl_loss=true" in msg
    assert compose_run(["algorithm.ref_update_interval=10", "algorithm.use_kl_loss=true",
                        "algorithm.kl_loss_coef=0.01"]).algorithm.ref_update_interval == 10
    (msg,) = problems_of(["algorithm.ref_update_interval=0", "algorithm.use_kl_loss=true"])
    assert ">= 1 or null" in msg


def test_one_sample_per_prompt_turns_std_normalization_off():
    # REINFORCE++ has no group baseline, so n=1 is valid; GRPO's std normalization has no group std then
    overrides = ["algorithm=reinforce_plus_plus", "rollout.n_samples_per_prompt=1", "rollout.rollout_batch_size=8",
                 "train.micro_batch_size=8"]
    with Composer("config") as composer:
        cfg, problems = check_overrides(composer, overrides)
        typed, more, notes = check_composed(cfg)
    assert problems == more == [] and typed.algorithm.grpo_std_normalization is False
    assert any("grpo_std_normalization turned off" in n for n in notes)
