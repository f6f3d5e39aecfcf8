"""PPO: GAE over the critic's values by hand, the critic learning its targets, critic-only steps,
and the reference refresh of algorithm.ref_update_interval, through the real TorchTrainBackend."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from slime_hydra.algorithms.advantages import ppo_advantages
from slime_hydra.config.schema import AlgorithmConfig, TrainConfig
from slime_hydra.training.torch_backend import TorchTrainBackend
from tests.support.learning import report
from tests.support.tiny import CPU, MAX_LEN, TOK, base_model, samples
from tests.support.trainers import algo_advantages, torch_backend

t = lambda rows: torch.tensor(rows, dtype=torch.float64)  # noqa: E731


def test_ppo_advantages_by_hand():
    # one row, position 0 is the prompt's, positions 1-2 predict the two response tokens; R = 1 at the last
    mask, values = t([[0, 1, 1]]), t([[9.0, 0.5, 0.2]])  # the prompt position's value is masked away
    # lambda = 1: delta_2 = 1 + 0 - 0.2 = 0.8, delta_1 = 0 + 0.2 - 0.5 = -0.3; A_2 = 0.8, A_1 = -0.3 + 0.8 = 0.5;
    # returns = A + V = [0, 1.0, 1.0] (Monte Carlo: the reward itself)
    adv, ret = ppo_advantages(t([1.0]), mask, None, values, gamma=1.0, lambd=1.0, normalize_advantages=False)
    assert_close(adv, t([[0, 0.5, 0.8]]))
    assert_close(ret, t([[0, 1.0, 1.0]]))
    # lambda = 0.5: A_1 = -0.3 + 0.5 * 0.8 = 0.1, returns_1 = 0.1 + 0.5 = 0.6
    adv, ret = ppo_advantages(t([1.0]), mask, None, values, gamma=1.0, lambd=0.5, normalize_advantages=False)
    assert_close(adv, t([[0, 0.1, 0.8]]))
    assert_close(ret, t([[0, 0.6, 1.0]]))
    # KL shaping, kl_coef 0.5, kl = [., 0.2, 0.4]: r = [0, -0.1, 1 - 0.2 = 0.8]; V = 0, lambda = 1:
    # A_2 = 0.8, A_1 = -0.1 + 0.8 = 0.7
    adv, ret = ppo_advantages(t([1.0]), mask, t([[0, 0.2, 0.4]]), torch.zeros_like(mask), kl_coef=0.5,
                              normalize_advantages=False)
    assert_close(adv, t([[0, 0.7, 0.8]]))
    # whitening: the two values 0.7, 0.8 -> mean 0.75, Bessel var 0.005 -> -/+ 0.05 / sqrt(0.005 + 1e-8)
    adv, ret2 = ppo_advantages(t([1.0]), mask, t([[0, 0.2, 0.4]]), torch.zeros_like(mask), kl_coef=0.5)
    z = 0.05 / (0.005 + 1e-8) ** 0.5
    assert_close(adv, t([[0, -z, z]]))
    assert_close(ret2, ret)  # the critic's targets are taken before whitening


def ppo_backend(**algo_kw) -> tuple[TorchTrainBackend, AlgorithmConfig]:
    algo = AlgorithmConfig(advantage_estimator="ppo", normalize_advantages=True, **algo_kw)
    train = TrainConfig(micro_batch_size=4, global_batch_size=8, num_steps_per_rollout=1, lr=1e-3, critic_lr=1e-2,
                        clip_grad=0.0)
    b = torch_backend(base_model(), algo, train, temperature=1.0, total_steps=100, device=CPU, max_response_len=MAX_LEN)
    b.freeze_reference()
    return b, algo


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in module.parameters()])


def test_critic_learns_its_returns_and_first_step_metrics():
    b, algo = ppo_backend()
    assert b.critic.values(algo_advantages(samples(), algo, 2, TOK.pad_token_id, b)).abs().max() == 0  # zero head
    losses, first = [], None
    for i in range(40):
        batch = algo_advantages(samples(), algo, 2, TOK.pad_token_id, b)
        m = b.train_rollout(batch)
        first = first or m
        losses.append(m["train/value_loss"])
    # first step: values equal the old values (nothing is clipped) and the policy's ppo_kl is exactly 0
    assert first["train/value_clipfrac"] == 0 and first["train/ppo_kl"] == 0
    # zero values and returns R in {0, 1} on every response token: 0.5 * mean over samples of
    # R^2 = 0.5 * 5/8 (five of the eight samples are rewarded)
    assert abs(losses[0] - 0.5 * 5 / 8) < 1e-9
    report("torch_critic", value_loss_first=losses[0], value_loss_last=losses[-1], value_loss_ratio=losses[-1] / losses[0])
    assert losses[-1] < 0.25 * losses[0], losses  # the critic fits its targets


def test_critic_only_steps_leave_the_policy_alone():
    b, algo = ppo_backend(num_critic_only_steps=2)
    policy0, critic0 = flat(b.model), flat(b.critic.model)
    for _ in range(2):
        m = b.train_rollout(algo_advantages(samples(), algo, 2, TOK.pad_token_id, b))
        assert "train/pg_loss" not in m and "train/value_loss" in m
    assert torch.equal(flat(b.model), policy0) and not torch.equal(flat(b.critic.model), critic0)
    m = b.train_rollout(algo_advantages(samples(), algo, 2, TOK.pad_token_id, b))
    assert "train/pg_loss" in m and not torch.equal(flat(b.model), policy0)
    # the count survives a checkpoint: a restored backend continues with the policy training
    b2, _ = ppo_backend(num_critic_only_steps=2)
    b2.load_state_dict(b.state_dict())
    assert b2.schedule.rollouts_trained == 3 and torch.equal(flat(b2.critic.model), flat(b.critic.model))


def test_ref_update_interval_refreshes_the_reference():
    algo = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.1, ref_update_interval=2)
    train = TrainConfig(micro_batch_size=8, global_batch_size=8, num_steps_per_rollout=1, lr=1e-2, clip_grad=0.0)
    b = torch_backend(base_model(), algo, train, temperature=1.0, total_steps=10, device=CPU, max_response_len=MAX_LEN)
    b.freeze_reference()
    ref0 = flat(b.ref_model)
    b.train_rollout(algo_advantages(samples(), algo, 2, TOK.pad_token_id, b))
    assert torch.equal(flat(b.ref_model), ref0) and not torch.equal(flat(b.model), ref0)  # 1 rollout: kept
    b.train_rollout(algo_advantages(samples(), algo, 2, TOK.pad_token_id, b))
    assert torch.equal(flat(b.ref_model), flat(b.model))  # 2 rollouts: the policy's weights


def test_ppo_resumed_from_a_checkpoint_without_a_critic_names_the_fix():
    """A GRPO run's state (no critic) loaded into a PPO backend: a ConfigError (exit 2) naming the keys that start PPO from
    that policy instead, not a KeyError from deep inside the load."""
    import pytest

    from slime_hydra.errors import ConfigError

    train = TrainConfig(micro_batch_size=4, global_batch_size=8, num_steps_per_rollout=1, lr=1e-3)
    grpo = torch_backend(base_model(), AlgorithmConfig(), train, temperature=1.0, total_steps=10, device=CPU,
                         max_response_len=MAX_LEN)
    ppo, _ = ppo_backend()
    with pytest.raises(ConfigError) as e:
        ppo.load_state_dict(grpo.state_dict())
    (problem,) = e.value.problems
    assert "holds no critic" in problem and "algorithm.advantage_estimator" in problem, problem
    assert "set model.hf_checkpoint to the checkpoint's directory" in problem and "leave out load=" in problem, problem
