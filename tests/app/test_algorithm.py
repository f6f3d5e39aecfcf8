"""app/algorithm.py: the specs built from every algorithm option compute what the name-branching path computed.

For each option in conf/algorithm/*.yaml (and variants that switch on TIS, the KL loss, the entropy bonus,
dual clip, KL reward shaping and the two plug-ins), the policy loss through the LossSpec and the advantages
through the AdvantageSpec are compared, bit for bit, on fixed tensors with `old_*` below: a copy of the
branching code that training/policy_loss.py and engine/steps.py held before the specs, calling the pure
functions of slime_hydra/algorithms/ with the config's own fields.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from functools import partial
from pathlib import Path

import pytest
import torch

from slime_hydra.algorithms import losses as L
from slime_hydra.algorithms import surrogates as S
from slime_hydra.algorithms.advantages import ppo_advantages
from slime_hydra.algorithms.estimators import ESTIMATORS, compute_advantages
from slime_hydra.app.algorithm import algorithm_specs, run_specs
from slime_hydra.app.plugins import load_target
from slime_hydra.app.preflight import compose_run
from slime_hydra.config.schema import AlgorithmConfig
from slime_hydra.engine.steps import advantages
from slime_hydra.training.batch import collate
from slime_hydra.training.policy_loss import old_log_probs, policy_loss
from slime_hydra.types import Sample

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = sorted(p.stem for p in (ROOT / "conf" / "algorithm").glob("*.yaml"))
VARIANTS = {  # fields set on top of an option: the switches the options leave off (each a combination validation accepts)
    "plain": {},
    "tis": dict(use_tis=True, tis_clip=1.1, tis_clip_low=0.95),
    "kl_loss": dict(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k2", entropy_coef=0.01),
    "unbiased_kl": dict(use_kl_loss=True, kl_loss_coef=0.1, use_unbiased_kl=True, use_rollout_logprobs=True),
    "dual_clip": dict(eps_clip_c=3.0),
}
CUSTOM_LOSS = {"_target_": "tests.support.plugins.reinforce_surrogate", "scale": 2.0}
MAX_LEN = 6  # rollout.rollout_max_response_len: seq_mean_token_sum_norm's normalizer (dr_grpo)


@functools.lru_cache(maxsize=None)
def composed(option: str):
    """The option composed and validated once (the variants replace fields of its algorithm group)."""
    return compose_run([f"algorithm={option}", f"rollout.rollout_max_response_len={MAX_LEN}"])


def algo_of(option: str, **fields) -> AlgorithmConfig:
    return dataclasses.replace(composed(option).algorithm, **fields)


def specs_of(a: AlgorithmConfig, train=None):
    return algorithm_specs(a, train or composed("grpo").train, total_steps=10, max_response_len=MAX_LEN)


# -- the path before the specs (training/policy_loss.py and engine/steps.py at 35bd463) ----------------------------
def old_surrogate(a, custom_loss, logp, old, adv, mask):
    if custom_loss is not None:
        return custom_loss(logp, old, adv, mask), torch.zeros_like(logp), old - logp
    if a.advantage_estimator == "gspo":
        return S.gspo_loss(logp, old, adv, mask, a.eps_clip, a.eps_clip_high, a.eps_clip_c)
    if a.advantage_estimator == "cispo":
        return S.cispo_loss(logp, old, adv, a.eps_clip, a.eps_clip_high)
    return L.ppo_clip_loss(logp, old, adv, a.eps_clip, a.eps_clip_high, a.eps_clip_c)


def old_policy_loss(a, custom_loss, logp, ent, old, adv, mask, rollout_lp, ref_logp, denom):
    mode = a.loss_aggregation
    pg_tok, clipped, ppo_kl = old_surrogate(a, custom_loss, logp, old, adv, mask)
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
        per_token["rollout_logprob_abs_diff"] = ((logp.detach() if a.use_rollout_logprobs else old) - rollout_lp).abs()
    return loss, scalars, per_token


def old_advantages(samples, algo, group_size, pad_id, trainer):
    batch = collate(samples, torch.zeros(len(samples)), pad_id)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    kl = trainer.reward_kl(batch) if algo.kl_coef else None
    if algo.advantage_estimator == "ppo":
        batch.values = trainer.values(batch)
        batch.advantages, batch.returns = ppo_advantages(rewards, batch.loss_mask, kl, batch.values, kl_coef=algo.kl_coef,
                                                         gamma=algo.gamma, lambd=algo.lambd,
                                                         normalize_advantages=algo.normalize_advantages)
        return batch
    batch.advantages = compute_advantages(
        algo.advantage_estimator, rewards, batch.loss_mask, kl, group_size,
        rewards_normalization=algo.rewards_normalization, grpo_std_normalization=algo.grpo_std_normalization,
        kl_coef=algo.kl_coef, gamma=algo.gamma, normalize_advantages=algo.normalize_advantages,
        custom=load_target(algo.custom_advantage))
    return batch


# -- fixed inputs -----------------------------------------------------------------------------------------------------
def loss_inputs():
    """[4, 6] log-probs far enough from the old ones that every clip range of the options acts somewhere."""
    g = torch.Generator().manual_seed(7)
    old = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3  # [n, T]
    logp = (old + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.4).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=torch.float64)[:, None].expand(4, 6).clone()
    mask = torch.ones(4, 6, dtype=torch.float64)
    mask[:, :2] = 0  # the prompt
    mask[3, 5] = 0  # a shorter response
    ent = torch.rand(4, 6, generator=g, dtype=torch.float64)
    rollout_lp = old + 0.05 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    ref = old - 0.3 * torch.rand(4, 6, generator=g, dtype=torch.float64)
    return logp, ent, old, adv, mask, rollout_lp, ref


def run_loss(fn, aggregation: str):
    """fn(logp, ent, old, adv, mask, rollout_lp, ref_logp, denom) on the fixed inputs -> (loss, scalars, per_token, grad)."""
    logp, ent, old, adv, mask, rollout_lp, ref = loss_inputs()
    loss, scalars, per_token = fn(logp, ent, old, adv, mask, rollout_lp, lambda: ref, L.step_denominator([mask], aggregation, 6))
    loss.backward()
    return loss.detach(), {k: v.detach() for k, v in scalars.items()}, per_token, logp.grad


class FixedTrainer:
    """What the advantage step asks of a trainer, as fixed tensors: the shaping KL and the critic's values."""

    def reward_kl(self, batch):
        g = torch.Generator().manual_seed(1)
        return torch.rand(batch.loss_mask.shape, generator=g) * 0.2 * batch.loss_mask  # [N, T]

    def values(self, batch):
        g = torch.Generator().manual_seed(2)
        return torch.randn(batch.loss_mask.shape, generator=g) * batch.loss_mask  # [N, T]


def samples(group_size: int = 4) -> list[Sample]:
    """Two groups of 4, responses of 2-4 tokens after a 3-token prompt, rewards with one tied group."""
    rewards = [1.0, 0.0, 0.5, 1.0, 0.3, 0.3, 0.3, 0.3]
    out = []
    for i, r in enumerate(rewards):
        n = 2 + i % 3
        out.append(Sample(prompt="p", group_index=i // group_size, index=i, prompt_tokens=[5, 6, 7],
                          tokens=[5, 6, 7] + [10 + i + k for k in range(n)], response_length=n, reward=r,
                          loss_mask=[1] * n))
    return out


# -- the tests ------------------------------------------------------------------------------------------------------
def test_every_algorithm_option_is_covered():
    assert OPTIONS == ["cispo", "dapo", "dr_grpo", "grpo", "gspo", "ppo", "reinforce_plus_plus",
                       "reinforce_plus_plus_baseline", "rloo"]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("option", OPTIONS)
def test_loss_spec_computes_the_old_policy_loss(option, variant):
    a = algo_of(option, **VARIANTS[variant])
    spec = specs_of(a).loss
    new = run_loss(partial(policy_loss, spec), a.loss_aggregation)
    old = run_loss(partial(old_policy_loss, a, None), a.loss_aggregation)
    assert torch.equal(new[0], old[0]), (option, variant)
    assert new[1].keys() == old[1].keys() and all(torch.equal(new[1][k], old[1][k]) for k in old[1])
    assert new[2].keys() == old[2].keys() and all(torch.equal(new[2][k].detach(), old[2][k].detach()) for k in old[2])
    assert torch.equal(new[3], old[3])  # the gradient too


@pytest.mark.parametrize("option", OPTIONS)
def test_custom_loss_replaces_every_options_surrogate(option):
    a = algo_of(option, custom_loss=CUSTOM_LOSS)
    spec = specs_of(a).loss
    new = run_loss(partial(policy_loss, spec), a.loss_aggregation)
    old = run_loss(partial(old_policy_loss, a, load_target(a.custom_loss)), a.loss_aggregation)
    assert torch.equal(new[0], old[0]) and torch.equal(new[3], old[3])


def test_the_surrogate_is_the_pure_function_with_the_options_clip_range_bound():
    # one hop from the config: the partial holds algorithm.eps_clip / eps_clip_high; nothing else carries them
    for option, fn in [("grpo", L.ppo_clip_loss), ("dapo", L.ppo_clip_loss), ("ppo", L.ppo_clip_loss),
                       ("reinforce_plus_plus", L.ppo_clip_loss), ("gspo", S.gspo_loss), ("cispo", S.cispo_loss)]:
        a = composed(option).algorithm
        s = run_specs(composed(option)).loss.surrogate
        assert s.func is fn and s.keywords["eps_clip"] == a.eps_clip and s.keywords["eps_clip_high"] == a.eps_clip_high
    # by hand: ratio e^0.5 = 1.6487 > 1 + 0.28 (dapo's eps_clip_high) with A = 1 -> the clipped -1.28
    s = run_specs(composed("dapo")).loss.surrogate
    loss, clipped, _ = s(torch.tensor([[0.5]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]), mask=torch.ones(1, 1))
    assert torch.allclose(loss, torch.tensor([[-1.28]])) and clipped.item() == 1.0


def test_old_log_probs_follow_the_spec():
    logp, _, old, _, _, rollout_lp, _ = loss_inputs()
    on = specs_of(algo_of("grpo", use_rollout_logprobs=True)).loss
    off = specs_of(algo_of("grpo")).loss
    assert torch.equal(old_log_probs(on, logp, rollout_lp, old), rollout_lp)
    assert torch.equal(old_log_probs(off, logp, rollout_lp, old), old)
    assert torch.equal(old_log_probs(off, logp, rollout_lp, None), logp.detach())


ADV_VARIANTS = {
    "plain": {},
    "kl_shaping": dict(kl_coef=0.1, gamma=0.9),
    "raw_rewards": dict(rewards_normalization=False),
    "custom": dict(custom_advantage={"_target_": "tests.app.test_algorithm.scaled_reward", "scale": 3.0}),
}


def scaled_reward(rewards, mask, kl, group_size, scale=1.0):
    return (rewards * scale)[:, None].expand_as(mask)


def valid(option: str, variant: str) -> bool:
    """The combinations validation accepts (kl_coef needs an estimator that reads the shaped KL; a critic estimator
    takes no custom advantage)."""
    row = ESTIMATORS[composed(option).algorithm.advantage_estimator]
    return not ((variant == "kl_shaping" and not row.shaped_kl) or (variant == "custom" and row.critic))


@pytest.mark.parametrize("option,variant", [(o, v) for o in OPTIONS for v in ADV_VARIANTS if valid(o, v)])
def test_advantage_spec_computes_the_old_advantages(option, variant):
    a = algo_of(option, **ADV_VARIANTS[variant])
    new = advantages(samples(), specs_of(a).advantage, 4, 0, FixedTrainer())
    old = old_advantages(samples(), a, 4, 0, FixedTrainer())
    assert torch.equal(new.advantages, old.advantages), (option, variant)
    assert (new.returns is None) == (old.returns is None)
    if old.returns is not None:
        assert torch.equal(new.returns, old.returns) and torch.equal(new.values, old.values)
    assert new.advantages.abs().sum() > 0  # not vacuous: the second group ties, the first does not


def test_grpo_advantages_by_hand():
    # group 1 rewards [1, 0, 0.5, 1]: mean 0.625, unbiased std sqrt(0.229167) = 0.478714;
    # sample 0: 0.375 / (0.478714 + 1e-6) = 0.783345 on each of its 2 response tokens; group 2 ties: 0
    b = advantages(samples(), run_specs(composed("grpo")).advantage, 4, 0, FixedTrainer())
    row0 = b.advantages[0][b.loss_mask[0] > 0]
    assert torch.allclose(row0, torch.full((2,), 0.783345), atol=1e-6)
    assert b.advantages[4:].abs().max() == 0


def test_rloo_advantages_by_hand():
    # algorithm=rloo composed, through the AdvantageSpec: group 1 rewards [1, 0, 0.5, 1], mean 0.625,
    # r - mean = [0.375, -0.625, -0.125, 0.375], times G/(G-1) = 4/3: [0.5, -0.833333, -0.166667, 0.5]
    # (sample 0: 1 - mean(0, 0.5, 1) = 0.5); group 2 ties: 0. Each value on every response token of its sample.
    b = advantages(samples(), run_specs(composed("rloo")).advantage, 4, 0, FixedTrainer())
    for i, expected in enumerate([0.5, -0.833333, -0.166667, 0.5]):
        row = b.advantages[i][b.loss_mask[i] > 0]
        assert torch.allclose(row, torch.full_like(row, expected), atol=1e-6), (i, row)
    assert b.advantages[4:].abs().max() == 0
    assert run_specs(composed("rloo")).critic is None


def test_only_ppo_gets_a_critic():
    for option in OPTIONS:
        s = run_specs(composed(option))
        assert (s.critic is not None) == (option == "ppo"), option
        assert (s.advantage.gae is not None) == (option == "ppo"), option
    train = dataclasses.replace(composed("ppo").train, critic_lr=1e-5, lr=2e-6, min_lr=1e-6)
    c = specs_of(algo_of("ppo"), train).critic
    assert c.optim.lr == 1e-5 and c.optim.min_lr == pytest.approx(5e-6)  # min_lr scales with the critic's lr


def test_no_algorithm_name_or_group_below_the_composition_floor():
    """The trainers, the critic and the advantage step take specs: no AlgorithmConfig / TrainConfig import and
    no comparison with an estimator's name in training/ or engine/steps.py. (A component's checks.py is validation:
    app/checks.py hands it the config groups it reads, so it is not held to this.)"""
    files = [*sorted(p for p in (ROOT / "slime_hydra" / "training").rglob("*.py") if p.name != "checks.py"),
             ROOT / "slime_hydra" / "engine" / "steps.py"]
    for f in files:
        text = f.read_text()
        assert not re.search(r"import[^\n]*\b(AlgorithmConfig|TrainConfig)\b", text), f
        assert not re.search(r"advantage_estimator\s*(==|!=|in\b)|\"(gspo|cispo|ppo)\"", text), f
