"""A step whose gradient norm is NaN or inf is skipped (training/optim.py): no update, the Adam moments untouched,
counted in train/skipped_steps, and the next finite step trains as usual. Torch and megatron (CPU shim) backends."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from slime_hydra.config.schema import AlgorithmConfig, TrainConfig
from tests.support.tiny import CPU, MAX_LEN, base_model, make_batch
from tests.support.trainers import torch_backend


def poisoned(batch, value: float):
    """`batch` with every advantage of sample 0 set to `value`: its loss, so the step's gradient, is not finite."""
    bad = copy.deepcopy(batch)
    bad.advantages[0] = value
    return bad


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_torch_step_with_a_non_finite_gradient_is_skipped_and_the_next_one_trains(value):
    train = TrainConfig(micro_batch_size=4, global_batch_size=4, num_steps_per_rollout=2, lr=1e-2, clip_grad=1.0)
    b = torch_backend(base_model(), AlgorithmConfig(), train, temperature=1.0, total_steps=10, device=CPU,
                      max_response_len=MAX_LEN)
    b.freeze_reference()
    good = make_batch()
    start = {k: v.clone() for k, v in b.model.state_dict().items()}
    m = b.train_rollout(poisoned(good, value))  # step 1 holds sample 0: skipped; step 2 (samples 4-7) trains
    assert m["train/skipped_steps"] == 1.0  # a count over the rollout's 2 steps, not their mean
    assert math.isnan(m["train/grad_norm"])  # the mean of the two steps' norms: the skipped one's is NaN
    state = b.optimizer.state_dict()["state"]
    assert all(float(s["step"]) == 1.0 for s in state.values())  # one update only: the skipped step left no trace
    assert all(torch.isfinite(p).all() for p in b.model.parameters())
    assert all(torch.isfinite(s["exp_avg_sq"]).all() for s in state.values())
    moved = b.model.state_dict()
    assert any(not torch.equal(start[k], moved[k]) for k in start)  # the second step did train
    assert b.scheduler.last_epoch == 2  # the schedule advanced over the skipped step too

    m2 = b.train_rollout(good)
    assert m2["train/skipped_steps"] == 0.0 and math.isfinite(m2["train/grad_norm"])
    assert all(float(s["step"]) == 3.0 for s in b.optimizer.state_dict()["state"].values())


def test_torch_skipped_step_leaves_weights_and_moments_bit_identical():
    train = TrainConfig(micro_batch_size=8, global_batch_size=8, num_steps_per_rollout=1, lr=1e-2)
    b = torch_backend(base_model(), AlgorithmConfig(), train, temperature=1.0, total_steps=10, device=CPU,
                      max_response_len=MAX_LEN)
    b.freeze_reference()
    b.train_rollout(make_batch())
    weights, moments = copy.deepcopy(b.model.state_dict()), copy.deepcopy(b.optimizer.state_dict())
    m = b.train_rollout(poisoned(make_batch(), float("nan")))
    assert m["train/skipped_steps"] == 1.0
    after = b.model.state_dict()
    assert all(torch.equal(weights[k], after[k]) for k in weights)
    for i, s in moments["state"].items():
        now = b.optimizer.state_dict()["state"][i]
        assert all(torch.equal(s[k], now[k]) for k in s)


def test_megatron_step_with_a_nan_gradient_is_skipped_and_the_next_one_trains():
    from tests.support.megatron_cpu import shim, workers
    from tests.support.trainers import megatron_backend

    shim.install()
    cfg, _, hf = workers.tiny_setup()  # 2 optimizer steps per rollout of the fixed 4-sample batch (2 + 2)
    b = megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train, 1.0, 10,
                         torch.device("cpu"), seed=cfg.seed, max_response_len=8)
    batch = workers.fixed_batch()
    before = b.compute_log_probs(batch)
    m = b.train_rollout(poisoned(batch, float("nan")))  # step 1 (samples 0, 1) skipped, step 2 trains
    assert m["train/skipped_steps"] == 1.0
    after = b.compute_log_probs(batch)
    assert torch.isfinite(after).all() and (after - before).abs().max() > 0
    nan_all = copy.deepcopy(batch)
    nan_all.advantages[:] = float("nan")
    m = b.train_rollout(nan_all)  # both steps skipped: the weights do not move at all
    assert m["train/skipped_steps"] == 2.0
    assert torch.equal(b.compute_log_probs(batch), after)
    m = b.train_rollout(batch)
    assert m["train/skipped_steps"] == 0.0 and math.isfinite(m["train/grad_norm"])
    assert (b.compute_log_probs(batch) - after).abs().max() > 0
