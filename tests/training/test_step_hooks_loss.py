"""algorithm.custom_tis_function and algorithm.custom_pg_loss_reducer_function in the policy loss, with the losses
worked out by hand: the TIS function's weights and rejections reach the policy-gradient term, and the reducer's
reduction is the step's pg_loss on both trainers."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from slime_hydra.app.algorithm import loss_spec
from slime_hydra.app.preflight import compose_run
from tests.support.megatron_cpu import shim, workers

TIS = ["algorithm.use_tis=true", "algorithm.loss_aggregation=token_mean"]
REDUCER = "++algorithm.custom_pg_loss_reducer_function={_target_:tests.support.step_hooks.constant_sum_reducer,constant:8.0}"


def tis_loss(overrides: list[str]):
    """One micro-batch of 3 tokens, log π = old (ratio 1, PPO loss -A = -1 each), old - rollout = (0, ln 2, 0): importance
    weights (1, 2, 1)."""
    spec = loss_spec(compose_run([*TIS, *overrides]).algorithm)
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    rollout = old - torch.tensor([[0.0, math.log(2.0), 0.0]])
    mask, adv = torch.ones(1, 3), torch.ones(1, 3)
    return spec.objective(spec, old.clone(), torch.zeros_like(old), old, adv, mask, rollout, lambda: None, 3.0)


def test_a_custom_tis_function_reweights_and_rejects_tokens():
    """Vanilla TIS (tis_clip 2): (-1·1 - 1·2 - 1·1) / 3 = -4/3. rejection_tis with max_ratio 1.5 rejects the middle token
    (weight 2 > 1.5): (-1 + 0 - 1) / 3 = -2/3 (the denominator stays the loss mask's 3 tokens, as slime keeps it), and its
    per-token metric tis_rejected is (0, 1, 0)."""
    vanilla, _, per_token = tis_loss([])
    assert vanilla.item() == pytest.approx(-4 / 3) and per_token["tis_clipfrac"].tolist() == [[0.0, 0.0, 0.0]]
    custom, scalars, per_token = tis_loss(["++algorithm.custom_tis_function={_target_:tests.support.step_hooks.rejection_tis,"
                                           "max_ratio:1.5}"])
    assert custom.item() == pytest.approx(-2 / 3) and scalars["pg_loss"] is custom
    assert per_token["tis_rejected"].tolist() == [[0.0, 1.0, 0.0]] and "tis_clipfrac" not in per_token


def test_a_pg_loss_reducer_replaces_the_aggregation_of_the_policy_term_only():
    """Two samples, log π = old (the PPO term is -A per token), A = (1, 1 | 2, 2, 2) on masks of 2 and 3 tokens; the step's
    denominator is 2 samples. sample_token_mean: (-1 + -2) / 2 = -1.5. constant_sum_reducer(constant=8): every token summed
    over samples × 8: (-1 - 1 - 2 - 2 - 2) / (2 · 8) = -0.5. The entropy bonus keeps sample_token_mean: entropy 0.5
    everywhere, coefficient 0.1: loss = pg - 0.1 · 0.5 = pg - 0.05."""
    logp = torch.full((2, 3), -1.0)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]])
    for overrides, pg in (([], -1.5), ([REDUCER], -0.5)):
        spec = loss_spec(compose_run(["algorithm.entropy_coef=0.1", *overrides]).algorithm)
        loss, scalars, _ = spec.objective(spec, logp, torch.full((2, 3), 0.5), logp, adv, mask, None, lambda: None, 2.0)
        assert scalars["pg_loss"].item() == pytest.approx(pg) and loss.item() == pytest.approx(pg - 0.05)


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_the_reducer_is_the_trained_steps_pg_loss_on_both_trainers(backend):
    """One optimizer step over the fixed batch (4 samples, one per micro-batch; its own log-probs are the old ones, so the
    PPO term is -A): A = 1, -0.5, 0.7 on 7 tokens and -1.2 on 4: Σ A = 7 - 3.5 + 4.9 - 4.8 = 3.6, and the reducer's
    pg_loss is -3.6 / (4 samples · 8) = -0.1125, summed over the micro-batches. sample_token_mean's is
    -(1 - 0.5 + 0.7 - 1.2) / 4 = 0."""
    from tests.support.trainers import megatron_backend, torch_backend

    shim.install()
    for overrides, want in (([], 0.0), ([REDUCER], -0.1125)):
        cfg, _, hf = workers.tiny_setup(["train.num_steps_per_rollout=1", *overrides])
        if backend == "torch":
            trainer = torch_backend(copy.deepcopy(hf), cfg.algorithm, cfg.train, 1.0, 10, torch.device("cpu"))
        else:
            trainer = megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train,
                                       1.0, 10, torch.device("cpu"), seed=cfg.seed)
        m = trainer.train_rollout(workers.fixed_batch())
        assert m["train/pg_loss"] == pytest.approx(want, abs=1e-6), (overrides, m["train/pg_loss"])
