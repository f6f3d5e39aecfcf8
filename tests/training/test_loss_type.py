"""algorithm.loss_type: policy_loss (the default), sft_loss (slime's: the response tokens' negative log-likelihood,
advantages unread) and custom_loss (the policy loss on algorithm.custom_loss), on both trainers."""

from __future__ import annotations

import copy

import pytest
import torch

from slime_hydra.app.algorithm import loss_spec
from slime_hydra.app.preflight import compose_run
from slime_hydra.errors import ConfigError
from tests.support.megatron_cpu import shim, workers

SFT = ["algorithm.loss_type=sft_loss", "algorithm.loss_aggregation=token_mean", "train.num_steps_per_rollout=1"]


def test_sft_loss_is_the_masked_tokens_mean_negative_log_likelihood():
    """token_mean over the step's 5 masked tokens: (1 + 2 + 0.5 + 1.5 + 4) / 5 = 1.8; the advantages (huge, signed)
    and the old log-probs do not enter."""
    spec = loss_spec(compose_run(SFT).algorithm)
    logp = torch.tensor([[-1.0, -2.0, -7.0], [-0.5, -1.5, -4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[50.0, -50.0, 3.0], [-9.0, 9.0, 1.0]])
    loss, scalars, per_token = spec.objective(spec, logp, torch.zeros_like(logp), logp - 3.0, adv, mask, None,
                                              lambda: pytest.fail("the reference is not read"), 5.0)
    assert loss.item() == pytest.approx(1.8, abs=1e-7) and scalars == {"loss": loss} and set(per_token) == {"entropy"}


def nll(log_probs: torch.Tensor, mask: torch.Tensor) -> float:
    return float(-(log_probs * mask).sum() / mask.sum())


def sft_rollout(trainer) -> tuple[float, float, dict]:
    """(NLL before, NLL after, metrics) of one sft_loss rollout on the fixed batch with every advantage 0."""
    batch = workers.fixed_batch()
    batch.advantages = torch.zeros_like(batch.advantages)
    before = nll(trainer.compute_log_probs(batch), batch.loss_mask)
    metrics = trainer.train_rollout(batch)
    return before, nll(trainer.compute_log_probs(batch), batch.loss_mask), metrics


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_sft_loss_trains_the_responses_whatever_their_advantage(backend):
    """With every advantage 0 the policy loss has no gradient; sft_loss's first step reports the batch's NLL under the
    weights it starts from (train/loss) and lowers it."""
    from tests.support.trainers import megatron_backend, torch_backend

    shim.install()
    cfg, _, hf = workers.tiny_setup(SFT)
    if backend == "torch":
        trainer = torch_backend(copy.deepcopy(hf), cfg.algorithm, cfg.train, 1.0, 10, torch.device("cpu"), max_response_len=8)
    else:
        trainer = megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train, 1.0,
                                   10, torch.device("cpu"), seed=cfg.seed, max_response_len=8)
    before, after, m = sft_rollout(trainer)
    assert m["train/loss"] == pytest.approx(before, rel=1e-5) and "train/pg_loss" not in m
    assert after < before - 0.05, (before, after)


def test_loss_type_conflicts_are_named_before_launch():
    with pytest.raises(ConfigError) as e:
        compose_run(["algorithm.loss_type=custom_loss"])
    assert "algorithm.loss_type=custom_loss needs algorithm.custom_loss" in str(e.value)
    with pytest.raises(ConfigError) as e:
        compose_run([*SFT, "algorithm.use_kl_loss=true", "algorithm.entropy_coef=0.01"])
    assert ("algorithm.loss_type=sft_loss trains on the response tokens' negative log-likelihood alone: "
            "algorithm.use_kl_loss, algorithm.entropy_coef would be ignored") in str(e.value)


def test_custom_loss_type_runs_the_users_function():
    """custom_loss: the policy loss whose per-token surrogate is the user's (REINFORCE scaled by 2: -2·A·log π), token
    mean over 2 tokens: A = (1, -1), log π = (-1, -2): (2 - 4) / 2 = -1; A = (1, 1): (2 + 4) / 2 = 3."""
    cfg = compose_run(["algorithm.loss_type=custom_loss", "algorithm.loss_aggregation=token_mean",
                       "+algorithm.custom_loss._target_=tests.support.plugins.reinforce_surrogate",
                       "+algorithm.custom_loss.scale=2.0"])
    spec = loss_spec(cfg.algorithm)
    logp, mask = torch.tensor([[-1.0, -2.0]]), torch.ones(1, 2)
    for adv, want in (([1.0, -1.0], -1.0), ([1.0, 1.0], 3.0)):
        loss, scalars, _ = spec.objective(spec, logp, torch.zeros_like(logp), logp, torch.tensor([adv]), mask, None,
                                          lambda: None, 2.0)
        assert loss.item() == pytest.approx(want) and scalars["pg_loss"] is loss
