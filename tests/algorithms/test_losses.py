"""Hand-derived checks of the losses (algorithms/losses.py, algorithms/surrogates.py): the PPO clip, GSPO, CISPO, TIS,
the KL estimators (plain and unbiased), entropy and every aggregation mode.

Conventions (slime): ratio = exp(log_probs - old_log_probs), ppo_kl = old_log_probs - log_probs,
L = max(-ratio*A, -clip(ratio, 1-eps, 1+eps_high)*A), dual clip for A < 0: L = min(L, -eps_c*A),
clipfrac = 1 where the clipped branch is strictly larger (torch.gt(pg_losses2, pg_losses1)).
Every expected number below is worked out in the comments; gradients are checked where the stop-gradient placement is
the point.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from slime_hydra.algorithms.losses import (
    aggregate,
    clipped_surrogate,
    entropy_from_logits,
    kl_estimate,
    log_probs_from_logits,
    metric_aggregation,
    ppo_clip_loss,
    sft_token_loss,
    step_denominator,
    unbiased_kl_estimate,
)
from slime_hydra.algorithms.surrogates import cispo_loss, gspo_loss, sequence_mean_log_ratio, tis_weights

F64 = torch.float64
LN2, LN3 = math.log(2.0), math.log(3.0)


def t(rows):
    return torch.tensor(rows, dtype=F64)


# --------------------------------------------------------------------------- log-probs / entropy


def test_log_probs_from_logits_temperature_one():
    # logits [0, ln2, ln3] -> exp = [1, 2, 3], Z = 6 -> probs [1/6, 1/3, 1/2]
    # position 0 targets token 1 -> ln(1/3) = -1.0986123
    # position 1 targets token 2 -> ln(1/2) = -0.6931472
    logits = torch.tensor([[[0.0, LN2, LN3], [0.0, LN2, LN3]]])  # [N=1, T=2, V=3]
    targets = torch.tensor([[1, 2]])
    out = log_probs_from_logits(logits, targets)
    assert out.shape == (1, 2)
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor([[math.log(1 / 3), math.log(1 / 2)]]), rtol=0, atol=1e-6)


def test_log_probs_from_logits_with_temperature():
    # temperature 0.5: logits / T = [0, 2 ln2, 2 ln3] -> exp = [1, 4, 9], Z = 14
    # token 2 -> ln(9/14) = -0.4418328 ; token 0 -> ln(1/14) = -2.6390573
    logits = torch.tensor([[[0.0, LN2, LN3], [0.0, LN2, LN3]]])
    targets = torch.tensor([[2, 0]])
    out = log_probs_from_logits(logits, targets, temperature=0.5)
    assert_close(out, torch.tensor([[math.log(9 / 14), math.log(1 / 14)]]), rtol=0, atol=1e-6)

    # temperature 2: logits / T = [0, ln2 / 2, ln3 / 2] -> exp = [1, sqrt2, sqrt3]
    # token 1 -> ln(sqrt2 / (1 + sqrt2 + sqrt3)) = ln(1.4142136 / 4.1462644) = -1.0756...
    out2 = log_probs_from_logits(logits[:, :1], targets[:, :1] * 0 + 1, temperature=2.0)
    z = 1 + math.sqrt(2) + math.sqrt(3)
    assert_close(out2, torch.tensor([[math.log(math.sqrt(2) / z)]]), rtol=0, atol=1e-6)


def test_log_probs_from_logits_bf16_input_is_computed_in_fp32():
    # logits [0, 0] in bf16 -> probs [1/2, 1/2] -> ln(1/2), returned as float32
    logits = torch.zeros(1, 1, 2, dtype=torch.bfloat16)
    out = log_probs_from_logits(logits, torch.tensor([[1]]))
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor([[-LN2]]), rtol=0, atol=1e-7)


def test_entropy_uniform_is_log_vocab():
    # Uniform over V = 8 tokens: H = -sum 1/8 ln(1/8) = ln 8 = 2.0794415, at any temperature.
    logits = torch.full((2, 3, 8), 1.7)
    for temp in (1.0, 0.3, 5.0):
        out = entropy_from_logits(logits, temperature=temp)
        assert out.shape == (2, 3)
        assert_close(out, torch.full((2, 3), math.log(8.0)), rtol=0, atol=1e-6)


def test_entropy_two_tokens_with_temperature():
    # logits [0, ln3] -> probs [1/4, 3/4]
    # H = 1/4 ln4 + 3/4 ln(4/3) = 0.3465736 + 0.2157616 = 0.5623351
    # logits [0, 2 ln3] at temperature 2 give the same scaled logits, hence the same entropy.
    h = 0.25 * math.log(4.0) + 0.75 * math.log(4.0 / 3.0)
    assert abs(h - 0.5623351) < 1e-7
    assert_close(entropy_from_logits(torch.tensor([[[0.0, LN3]]])), torch.tensor([[h]]), rtol=0, atol=1e-6)
    assert_close(
        entropy_from_logits(torch.tensor([[[0.0, 2 * LN3]]]), temperature=2.0), torch.tensor([[h]]), rtol=0, atol=1e-6
    )


def test_sft_token_loss_is_negative_log_prob():
    lp = torch.tensor([[-0.5, -2.0]])
    assert_close(sft_token_loss(lp), torch.tensor([[0.5, 2.0]]), rtol=0, atol=0)


# --------------------------------------------------------------------------- KL estimators

# log_ratio = log_probs - ref_log_probs, chosen as [0.5, -0.5, 0, -3, -12, 12, 1]; ref = -13 everywhere.
LOG_RATIO = [0.5, -0.5, 0.0, -3.0, -12.0, 12.0, 1.0]
REF = torch.full((1, 7), -13.0, dtype=F64)
LP = REF + torch.tensor([LOG_RATIO], dtype=F64)  # [-12.5, -13.5, -13, -16, -25, -1, -12]


def test_kl_k1():
    # k1 = log_ratio
    assert_close(kl_estimate(LP, REF, "k1"), torch.tensor([LOG_RATIO], dtype=F64), rtol=0, atol=1e-12)


def test_kl_k2():
    # k2 = log_ratio^2 / 2 = [0.125, 0.125, 0, 4.5, 72, 72, 0.5]
    expected = torch.tensor([[0.125, 0.125, 0.0, 4.5, 72.0, 72.0, 0.5]], dtype=F64)
    assert_close(kl_estimate(LP, REF, "k2"), expected, rtol=0, atol=1e-12)


# k3 = exp(-x) - 1 + x with x = log_ratio:
#   x =  0.5: e^-0.5 = 0.6065306597 -> 0.6065306597 - 1 + 0.5   = 0.1065306597
#   x = -0.5: e^0.5  = 1.6487212707 -> 1.6487212707 - 1 - 0.5   = 0.1487212707
#   x =  0  : 1 - 1 + 0                                          = 0
#   x = -3  : e^3    = 20.0855369232 -> 20.0855369232 - 1 - 3   = 16.0855369232
#   x = -12 : e^12   = 162754.791419 -> 162754.791419 - 13      = 162741.791419
#   x =  12 : e^-12  = 6.14421e-6    -> 6.14421e-6 - 1 + 12     = 11.0000061442
#   x =  1  : e^-1   = 0.3678794412  -> 0.3678794412 - 1 + 1    = 0.3678794412
K3 = [0.1065306597, 0.1487212707, 0.0, 16.0855369232, 162741.791419, 11.0000061442, 0.3678794412]


def test_kl_k3():
    out = kl_estimate(LP, REF, "k3")
    assert_close(out, torch.tensor([K3], dtype=F64), rtol=1e-9, atol=1e-9)
    assert (out >= 0).all()  # k3 is non-negative


def test_kl_low_var_kl_clamps_at_10():
    # low_var_kl = k3 clamped to [-10, 10]: 16.08.. -> 10, 162741.8 -> 10, 11.000006 -> 10; the rest as k3.
    expected = [0.1065306597, 0.1487212707, 0.0, 10.0, 10.0, 10.0, 0.3678794412]
    assert_close(kl_estimate(LP, REF, "low_var_kl"), torch.tensor([expected], dtype=F64), rtol=1e-9, atol=1e-9)


def test_kl_unknown_type():
    with pytest.raises(ValueError):
        kl_estimate(LP, REF, "k4")


# --------------------------------------------------------------------------- PPO clip


def _lp(ratios, old=-1.0):
    """log_probs / old_log_probs such that exp(log_probs - old) == ratio."""
    old_lp = torch.full((1, len(ratios)), old, dtype=F64)
    return old_lp + torch.tensor([ratios], dtype=F64).log(), old_lp


def test_ppo_ratio_inside_band_is_unclipped():
    # eps = 0.2, band [0.8, 1.2]
    # r = 1.1, A =  2  -> max(-2.2, -2.2) = -2.2, not clipped
    # r = 0.9, A = -1  -> max( 0.9,  0.9) =  0.9, not clipped
    # r = 1.0, A =  3  -> -3, not clipped
    lp, old = _lp([1.1, 0.9, 1.0])
    adv = torch.tensor([[2.0, -1.0, 3.0]], dtype=F64)
    loss, clipped, ppo_kl = ppo_clip_loss(lp, old, adv, eps_clip=0.2)
    assert_close(loss, torch.tensor([[-2.2, 0.9, -3.0]], dtype=F64), rtol=0, atol=1e-12)
    assert clipped.tolist() == [[0.0, 0.0, 0.0]]
    # ppo_kl = old - new = -ln r = [-ln1.1, -ln0.9, 0] = [-0.0953102, 0.1053605, 0]
    assert_close(ppo_kl, torch.tensor([[-math.log(1.1), -math.log(0.9), 0.0]], dtype=F64), rtol=0, atol=1e-12)


def test_ppo_clipped_branches():
    # eps = 0.2
    # t0: r = 1.5, A =  1 -> unclipped -1.5, clipped -1.2*1 = -1.2 -> max = -1.2, CLIPPED
    # t1: r = 0.5, A = -1 -> unclipped  0.5, clipped -0.8*-1 = 0.8 -> max =  0.8, CLIPPED
    # t2: r = 1.5, A = -1 -> unclipped  1.5, clipped  1.2         -> max =  1.5, not clipped (pessimistic side)
    # t3: r = 0.5, A =  1 -> unclipped -0.5, clipped -0.8         -> max = -0.5, not clipped
    # t4: r = 3.0, A =  0.5 -> unclipped -1.5, clipped -0.6       -> max = -0.6, CLIPPED
    lp, old = _lp([1.5, 0.5, 1.5, 0.5, 3.0])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 0.5]], dtype=F64)
    loss, clipped, ppo_kl = ppo_clip_loss(lp, old, adv, eps_clip=0.2)
    assert_close(loss, torch.tensor([[-1.2, 0.8, 1.5, -0.5, -0.6]], dtype=F64), rtol=0, atol=1e-12)
    assert clipped.tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0]]
    assert_close(ppo_kl, -torch.tensor([[1.5, 0.5, 1.5, 0.5, 3.0]], dtype=F64).log(), rtol=0, atol=1e-12)


def test_ppo_kl_is_old_minus_new():
    # old = -1.0, new = -1.5 -> ppo_kl = -1.0 - (-1.5) = 0.5 ; ratio = e^-0.5 = 0.6065 (< 0.8)
    # A = 1: unclipped -0.6065307, clipped -0.8 -> loss -0.6065307, not clipped
    old = torch.tensor([[-1.0]], dtype=F64)
    new = torch.tensor([[-1.5]], dtype=F64)
    loss, clipped, ppo_kl = ppo_clip_loss(new, old, torch.tensor([[1.0]], dtype=F64), eps_clip=0.2)
    assert_close(ppo_kl, torch.tensor([[0.5]], dtype=F64), rtol=0, atol=0)
    assert_close(loss, torch.tensor([[-math.exp(-0.5)]], dtype=F64), rtol=0, atol=1e-12)
    assert clipped.tolist() == [[0.0]]


def test_ppo_clip_higher_asymmetric():
    # eps_clip = 0.2 (low), eps_clip_high = 0.28 -> band [0.8, 1.28]
    # t0: r = 1.25, A = 1 -> inside the widened band: loss -1.25, not clipped
    #     (with a symmetric eps = 0.2 it would be clipped to -1.2, checked below)
    # t1: r = 1.30, A = 1 -> clipped to 1.28: loss -1.28, CLIPPED
    # t2: r = 0.70, A = -1 -> low side unchanged at 0.8: loss 0.8, CLIPPED
    # t3: r = 0.85, A = -1 -> inside: loss 0.85, not clipped
    lp, old = _lp([1.25, 1.30, 0.70, 0.85])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=F64)
    loss, clipped, _ = ppo_clip_loss(lp, old, adv, eps_clip=0.2, eps_clip_high=0.28)
    assert_close(loss, torch.tensor([[-1.25, -1.28, 0.8, 0.85]], dtype=F64), rtol=0, atol=1e-12)
    assert clipped.tolist() == [[0.0, 1.0, 1.0, 0.0]]

    # symmetric eps = 0.2: t0 -> -1.2 clipped, t1 -> -1.2 clipped, t2 -> 0.8 clipped, t3 -> 0.85 not clipped
    loss_s, clipped_s, _ = ppo_clip_loss(lp, old, adv, eps_clip=0.2)
    assert_close(loss_s, torch.tensor([[-1.2, -1.2, 0.8, 0.85]], dtype=F64), rtol=0, atol=1e-12)
    assert clipped_s.tolist() == [[1.0, 1.0, 1.0, 0.0]]


# Dual-clip tokens, eps = 0.2, eps_clip_c = 3:
#   t0: r = 4,   A = -1 -> unclipped 4, clipped 1.2, max 4; dual min(4, -3*-1 = 3) = 3
#   t1: r = 2,   A = -1 -> max(2, 1.2) = 2; dual min(2, 3) = 2 (dual bound not reached)
#   t2: r = 0.5, A = -1 -> max(0.5, 0.8) = 0.8 (clipped branch); dual min(0.8, 3) = 0.8
#   t3: r = 4,   A = +1 -> max(-4, -1.2) = -1.2 (clipped branch); A > 0 so no dual clip
#   t4: r = 4,   A = -2 -> max(8, 2.4) = 8; dual min(8, -3*-2 = 6) = 6
DUAL_RATIOS = [4.0, 2.0, 0.5, 4.0, 4.0]
DUAL_ADV = [-1.0, -1.0, -1.0, 1.0, -2.0]


def test_ppo_dual_clip_loss():
    lp, old = _lp(DUAL_RATIOS)
    adv = torch.tensor([DUAL_ADV], dtype=F64)
    loss, _, ppo_kl = ppo_clip_loss(lp, old, adv, eps_clip=0.2, eps_clip_c=3.0)
    assert_close(loss, torch.tensor([[3.0, 2.0, 0.8, -1.2, 6.0]], dtype=F64), rtol=0, atol=1e-12)
    assert_close(ppo_kl, -torch.tensor([DUAL_RATIOS], dtype=F64).log(), rtol=0, atol=1e-12)

    # Without dual clip the A < 0, large-ratio tokens are unbounded: t0 -> 4, t4 -> 8.
    loss_nd, _, _ = ppo_clip_loss(lp, old, adv, eps_clip=0.2)
    assert_close(loss_nd, torch.tensor([[4.0, 2.0, 0.8, -1.2, 8.0]], dtype=F64), rtol=0, atol=1e-12)


def test_ppo_dual_clip_clipfrac_matches_slime():
    # slime (slime/utils/ppo_utils.py::compute_policy_loss): clipfrac = torch.gt(pg_losses2, pg_losses1),
    # computed BEFORE and independently of the dual clip. So clipfrac is 1 only where the
    # clip(ratio, 1-eps, 1+eps_high) branch is taken:
    #   t0: gt(1.2, 4) = 0 ; t1: gt(1.2, 2) = 0 ; t2: gt(0.8, 0.5) = 1 ; t3: gt(-1.2, -4) = 1 ; t4: gt(2.4, 8) = 0
    # i.e. the same indicator as without eps_clip_c.
    lp, old = _lp(DUAL_RATIOS)
    adv = torch.tensor([DUAL_ADV], dtype=F64)
    _, clipped_nd, _ = ppo_clip_loss(lp, old, adv, eps_clip=0.2)
    assert clipped_nd.tolist() == [[0.0, 0.0, 1.0, 1.0, 0.0]]
    _, clipped, _ = ppo_clip_loss(lp, old, adv, eps_clip=0.2, eps_clip_c=3.0)
    assert clipped.tolist() == [[0.0, 0.0, 1.0, 1.0, 0.0]]


# --------------------------------------------------------------------------- aggregation

VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]], dtype=F64)
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]], dtype=F64)


def test_aggregate_sample_token_mean():
    # sample 0: (1 + 2) / 2 = 1.5 ; sample 1: (20 + 30 + 40) / 3 = 30
    # denominator 2 (samples in the step): (1.5 + 30) / 2 = 15.75
    assert_close(aggregate(VALUES, MASK, "sample_token_mean", 2.0), torch.tensor(15.75, dtype=F64), rtol=0, atol=1e-12)
    # explicit denominator, e.g. this is one micro-batch of a 4-sample step: 31.5 / 4 = 7.875
    assert_close(aggregate(VALUES, MASK, "sample_token_mean", 4.0), torch.tensor(7.875, dtype=F64), rtol=0, atol=1e-12)


def test_aggregate_sample_token_mean_empty_row_counts_as_zero():
    # A row with no trained token contributes 0 (its count is clamped to 1), and still counts in the
    # denominator the caller passes: (1.5 + 0) / 2 = 0.75
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    assert_close(aggregate(VALUES, mask, "sample_token_mean", 2.0), torch.tensor(0.75, dtype=F64), rtol=0, atol=1e-12)


def test_aggregate_token_mean():
    # masked sum = 1 + 2 + 20 + 30 + 40 = 93 ; 5 masked tokens -> 93 / 5 = 18.6
    assert_close(aggregate(VALUES, MASK, "token_mean", 5.0), torch.tensor(18.6, dtype=F64), rtol=0, atol=1e-12)
    # explicit denominator 10 -> 9.3
    assert_close(aggregate(VALUES, MASK, "token_mean", 10.0), torch.tensor(9.3, dtype=F64), rtol=0, atol=1e-12)


def test_aggregate_unknown_mode():
    with pytest.raises(ValueError):
        aggregate(VALUES, MASK, "seq_mean", 1.0)


def test_step_denominator():
    # micro-batch masks: the 2x4 MASK (5 ones) and a 1x3 mask [[1, 0, 1]] (2 ones)
    masks = [MASK, torch.tensor([[1.0, 0.0, 1.0]], dtype=F64)]
    # sample_token_mean: number of samples = 2 + 1 = 3
    assert step_denominator(masks, "sample_token_mean") == 3.0
    # token_mean: masked tokens = 5 + 2 = 7
    assert step_denominator(masks, "token_mean") == 7.0
    assert isinstance(step_denominator(masks, "token_mean"), float)
    assert isinstance(step_denominator(masks, "sample_token_mean"), float)


# Step of 3 samples (T = 3), split into micro-batches [s0] and [s1, s2]:
#   s0: values [1, 2, 3], mask [1, 1, 0]  -> masked sum 3,  count 2, mean 1.5
#   s1: values [4, 5, 6], mask [0, 1, 1]  -> masked sum 11, count 2, mean 5.5
#   s2: values [7, 8, 9], mask [1, 0, 0]  -> masked sum 7,  count 1, mean 7
# sample_token_mean, whole step: (1.5 + 5.5 + 7) / 3 = 14/3
#   micro-batches with the step denominator 3: 1.5/3 + (5.5 + 7)/3 = 0.5 + 12.5/3 = 14/3
#   (with their OWN denominators it would be 1.5/1 + 12.5/2 = 7.75 -- wrong)
# token_mean, whole step: (3 + 11 + 7) / 5 = 21/5 = 4.2
#   micro-batches with the step denominator 5: 3/5 + 18/5 = 0.6 + 3.6 = 4.2
#   (with their OWN denominators: 3/2 + 18/3 = 7.5 -- wrong)
STEP_V = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=F64)
STEP_M = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=F64)


@pytest.mark.parametrize("mode,whole", [("sample_token_mean", 14.0 / 3.0), ("token_mean", 4.2)])
def test_micro_batch_sum_equals_whole_step_hand(mode, whole):
    mbs = [(STEP_V[:1], STEP_M[:1]), (STEP_V[1:], STEP_M[1:])]
    denom = step_denominator([m for _, m in mbs], mode)
    assert denom == (3.0 if mode == "sample_token_mean" else 5.0)
    total = sum(aggregate(v, m, mode, denom) for v, m in mbs)
    assert_close(total, torch.tensor(whole, dtype=F64), rtol=0, atol=1e-12)
    assert_close(aggregate(STEP_V, STEP_M, mode, step_denominator([STEP_M], mode)),
                 torch.tensor(whole, dtype=F64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["sample_token_mean", "token_mean"])
def test_micro_batch_sum_equals_whole_step_random(mode):
    # Invariance on a random float64 step of 7 samples split 2 / 3 / 2, including a fully masked row.
    g = torch.Generator().manual_seed(0)
    values = torch.randn(7, 6, generator=g, dtype=F64)
    mask = (torch.rand(7, 6, generator=g, dtype=F64) > 0.4).to(F64)
    mask[3] = 0.0
    splits = [(0, 2), (2, 5), (5, 7)]
    mbs = [(values[a:b], mask[a:b]) for a, b in splits]
    denom = step_denominator([m for _, m in mbs], mode)
    assert denom == step_denominator([mask], mode)
    total = sum(aggregate(v, m, mode, denom) for v, m in mbs)
    assert_close(total, aggregate(values, mask, mode, step_denominator([mask], mode)), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- GSPO

# Two samples, T = 3. d = new - old per token.
#   s0: mask [1, 1, 0], d = [0.2, 0.0, 7.0] -> masked mean 0.1 (the 7.0 is off the mask)
#       seq ppo_kl = -0.1, ratio e^0.1 = 1.1051709 (inside [0.8, 1.2]); A = 1 -> loss -1.1051709, not clipped
#   s1: mask [0, 1, 1], d = [9.0, 0.5, 0.3] -> masked mean 0.4
#       seq ppo_kl = -0.4, ratio e^0.4 = 1.4918247 > 1.2; A = 2 -> max(-2.98365, -2.4) = -2.4, CLIPPED
GSPO_MASK = t([[1, 1, 0], [0, 1, 1]])
GSPO_OLD = t([[-1.0, -2.0, -5.0], [-3.0, -1.5, -0.7]])
GSPO_D = t([[0.2, 0.0, 7.0], [9.0, 0.5, 0.3]])
GSPO_ADV = t([[1, 1, 0], [0, 2, 2]])  # advantages are zero off the mask (collate)


def test_sequence_mean_log_ratio_broadcasts_the_masked_mean():
    seq = sequence_mean_log_ratio(GSPO_OLD + GSPO_D, GSPO_OLD, GSPO_MASK)
    assert_close(seq, t([[-0.1] * 3, [-0.4] * 3]), rtol=0, atol=1e-12)
    # a row with no trained token: 0 / clamp(0, 1) = 0
    assert sequence_mean_log_ratio(GSPO_OLD[:1] + 1.0, GSPO_OLD[:1], torch.zeros(1, 3, dtype=F64)).abs().max() == 0


def test_gspo_loss_clipfrac_and_ppo_kl():
    e1, e4 = math.exp(0.1), math.exp(0.4)
    assert abs(e1 - 1.1051709) < 1e-7 and abs(e4 - 1.4918247) < 1e-7
    loss, clipped, ppo_kl = gspo_loss(GSPO_OLD + GSPO_D, GSPO_OLD, GSPO_ADV, GSPO_MASK, eps_clip=0.2)
    # s0: every position carries the sequence ratio; A = 0 off the mask gives -0
    # s1: position 0 has A = 0 (0, not clipped: gt(-0, -0) is false), positions 1, 2: -1.2 * 2 = -2.4
    assert_close(loss, t([[-e1, -e1, 0.0], [0.0, -2.4, -2.4]]), rtol=0, atol=1e-12)
    assert clipped.tolist() == [[0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    assert_close(ppo_kl, t([[-0.1] * 3, [-0.4] * 3]), rtol=0, atol=1e-12)


def test_gspo_gradient_reaches_every_masked_token_through_the_mean():
    # sample_token_mean over the 2 samples: L = (1/2) * [(-e^0.1 - e^0.1)/2 + (-2.4 - 2.4)/2] = (-e^0.1 - 2.4) / 2
    # dL/dnew_{0,t} for masked t: (1/2) * (per-sample mean has the same value at both tokens) * d(-e^{m})/dnew_t
    #   with m = (d0 + d1)/2: d(-e^m)/dnew_t = -e^m / 2 -> dL/dnew_{0,0} = dL/dnew_{0,1} = -e^0.1 / 4 = -0.2762927
    # off-mask token (0, 2): 0. Sample 1 is clipped: 0 everywhere.
    new = (GSPO_OLD + GSPO_D).requires_grad_()
    loss, _, _ = gspo_loss(new, GSPO_OLD, GSPO_ADV, GSPO_MASK, eps_clip=0.2)
    aggregate(loss, GSPO_MASK, "sample_token_mean", 2.0).backward()
    g = -math.exp(0.1) / 4
    assert abs(g + 0.2762927) < 1e-7
    assert_close(new.grad, t([[g, g, 0.0], [0.0, 0.0, 0.0]]), rtol=0, atol=1e-12)


def test_gspo_equals_token_ppo_when_every_token_ratio_is_equal():
    # d = 0.1 on every token -> the sequence mean is the token value: the two surrogates agree.
    old = t([[-1.0, -2.0, -3.0]])
    mask = t([[1, 1, 1]])
    adv = t([[0.5, 0.5, 0.5]])
    lg, cg, kg = gspo_loss(old + 0.1, old, adv, mask, 0.2, 0.28, 3.0)
    lp, cp, kp = ppo_clip_loss(old + 0.1, old, adv, 0.2, 0.28, 3.0)
    assert_close(lg, lp, rtol=0, atol=1e-12)
    assert_close(kg, kp, rtol=0, atol=1e-12)
    assert cg.tolist() == cp.tolist()


def test_clipped_surrogate_matches_ppo_clip_loss():
    # ppo_clip_loss is clipped_surrogate on ppo_kl = old - new: r = 1.5, A = 1 -> -1.2 clipped (eps 0.2)
    old, new = t([[-1.0]]), t([[-1.0 + math.log(1.5)]])
    loss, clipped = clipped_surrogate(old - new, t([[1.0]]), 0.2)
    assert_close(loss, t([[-1.2]]), rtol=0, atol=1e-12)
    assert clipped.tolist() == [[1.0]]


# --------------------------------------------------------------------------- CISPO

# eps_clip 0.2, eps_clip_high 0.28 -> band [0.8, 1.28]
#   ratio [1.0, 1.5, 0.5, 1.1] -> truncated [1.0, 1.28, 0.8, 1.1], clipfrac [0, 1, 1, 0]
#   A     [1, 1, -1, 2], log pi [-0.5, -1.0, -2.0, -0.25]
#   L = -trunc * A * log pi = [0.5, 1.28, -1.6, 0.55]
#   dL/dlog pi = -trunc * A = [-1.0, -1.28, 0.8, -2.2]   (the ratio is a constant: stop-gradient)
CISPO_RATIO = [1.0, 1.5, 0.5, 1.1]
CISPO_ADV = t([[1.0, 1.0, -1.0, 2.0]])
CISPO_NEW = t([[-0.5, -1.0, -2.0, -0.25]])


def _cispo_old():
    return CISPO_NEW - t([CISPO_RATIO]).log()  # exp(new - old) = ratio


def test_cispo_loss_values_clipfrac_and_ppo_kl():
    loss, clipped, ppo_kl = cispo_loss(CISPO_NEW, _cispo_old(), CISPO_ADV, eps_clip=0.2, eps_clip_high=0.28)
    assert_close(loss, t([[0.5, 1.28, -1.6, 0.55]]), rtol=0, atol=1e-12)
    assert clipped.tolist() == [[0.0, 1.0, 1.0, 0.0]]
    assert_close(ppo_kl, -t([CISPO_RATIO]).log(), rtol=0, atol=1e-12)


def test_cispo_gradient_flows_only_through_log_pi():
    # Clipped tokens (1 and 2) still get gradient: -1.28 * 1 and -0.8 * -1 = 0.8.
    new = CISPO_NEW.clone().requires_grad_()
    loss, _, _ = cispo_loss(new, _cispo_old(), CISPO_ADV, eps_clip=0.2, eps_clip_high=0.28)
    loss.sum().backward()
    assert_close(new.grad, t([[-1.0, -1.28, 0.8, -2.2]]), rtol=0, atol=1e-12)


def test_cispo_canonical_wide_band():
    # eps_clip 1.0 (no lower bound: 1 - 1 = 0), eps_clip_high 4.0 -> band [0, 5]
    #   ratio 9 -> 5 (clipped), 0.01 -> 0.01 (not clipped), 3 -> 3
    #   A = 1, log pi = -1 -> L = -trunc * 1 * -1 = trunc = [5, 0.01, 3]
    ratio = [9.0, 0.01, 3.0]
    new = t([[-1.0, -1.0, -1.0]])
    loss, clipped, _ = cispo_loss(new, new - t([ratio]).log(), t([[1.0, 1.0, 1.0]]), eps_clip=1.0, eps_clip_high=4.0)
    assert_close(loss, t([[5.0, 0.01, 3.0]]), rtol=0, atol=1e-12)
    assert clipped.tolist() == [[1.0, 0.0, 0.0]]


def test_cispo_eps_clip_high_defaults_to_eps_clip():
    # eps 0.2 both sides: ratio 1.25 -> 1.2 clipped; A = 1, log pi = -1 -> L = 1.2
    new = t([[-1.0]])
    loss, clipped, _ = cispo_loss(new, new - math.log(1.25), t([[1.0]]), eps_clip=0.2)
    assert_close(loss, t([[1.2]]), rtol=0, atol=1e-12)
    assert clipped.tolist() == [[1.0]]


# --------------------------------------------------------------------------- TIS

# tis = exp(old - rollout) = [0.5, 1.0, 3.0, 1.5]
#   clip [0, 2]:   w = [0.5, 1.0, 2.0, 1.5], tis_clipfrac [0, 0, 1, 0]
#   clip [0.6, 2]: w = [0.6, 1.0, 2.0, 1.5], tis_clipfrac [1, 0, 1, 0]
TIS = [0.5, 1.0, 3.0, 1.5]


def test_tis_weights_default_band():
    rollout = t([[-1.0, -2.0, -0.5, -3.0]])
    old = rollout + t([TIS]).log()
    w, frac = tis_weights(old, rollout, 0.0, 2.0)
    assert_close(w, t([[0.5, 1.0, 2.0, 1.5]]), rtol=0, atol=1e-12)
    assert frac.tolist() == [[0.0, 0.0, 1.0, 0.0]]


def test_tis_weights_low_clip_and_detached():
    rollout = t([[-1.0, -2.0, -0.5, -3.0]])
    old = (rollout + t([TIS]).log()).requires_grad_()
    w, frac = tis_weights(old, rollout, 0.6, 2.0)
    assert_close(w, t([[0.6, 1.0, 2.0, 1.5]]), rtol=0, atol=1e-12)
    assert frac.tolist() == [[1.0, 0.0, 1.0, 0.0]]
    assert not w.requires_grad  # the weight is a constant for the loss


# --------------------------------------------------------------------------- unbiased KL

def test_unbiased_kl_k1_value_and_gradient_through_the_ratio():
    # new - old = ln 2 (ratio 2), new - ref = 0.5 -> k1 = 0.5, unbiased = 2 * 0.5 = 1.0
    # d/dnew [exp(new - old) * (new - ref)] = ratio * (new - ref) + ratio = 1.0 + 2.0 = 3.0
    # (slime does not detach the ratio; with it detached the gradient would be 2.0)
    old, ref = t([[-2.0]]), t([[-2.0 + math.log(2.0) - 0.5]])
    new = (old + math.log(2.0)).requires_grad_()
    kl = unbiased_kl_estimate(new, ref, old, "k1")
    assert_close(kl, t([[1.0]]), rtol=0, atol=1e-12)
    kl.sum().backward()
    assert_close(new.grad, t([[3.0]]), rtol=0, atol=1e-12)


def test_unbiased_kl_k3_and_low_var_clamp_after_the_ratio():
    # x = new - ref:
    #   token 0: x = 0.5, ratio 2   -> k3 = e^-0.5 - 1 + 0.5 = 0.1065306597 -> 0.2130613194
    #   token 1: x = -3,  ratio 0.5 -> k3 = e^3 - 1 - 3 = 16.0855369232 -> 8.0427684616
    # low_var_kl clamps AFTER the multiplication (slime): token 1 stays 8.0427684616 (< 10),
    # token 2: x = -3, ratio 2 -> 32.171 -> 10
    ratio = t([[2.0, 0.5, 2.0]])
    x = t([[0.5, -3.0, -3.0]])
    ref = t([[-1.0, -1.0, -1.0]])
    new = ref + x
    old = new - ratio.log()
    assert_close(unbiased_kl_estimate(new, ref, old, "k3"), t([[0.2130613194, 8.0427684616, 32.1710738464]]),
                 rtol=1e-9, atol=1e-9)
    assert_close(unbiased_kl_estimate(new, ref, old, "low_var_kl"), t([[0.2130613194, 8.0427684616, 10.0]]),
                 rtol=1e-9, atol=1e-9)
    # clamping first would give 0.5 * 10 = 5 for token 1
    assert kl_estimate(new, ref, "low_var_kl")[0, 1].item() * 0.5 == 5.0


def test_unbiased_kl_on_the_first_step_equals_the_plain_value():
    # old = new.detach(): the ratio is 1 in value, so the estimate equals kl_estimate.
    new, ref = t([[-1.0, -2.0]]), t([[-1.5, -1.0]])
    assert_close(unbiased_kl_estimate(new, ref, new.detach(), "k3"), kl_estimate(new, ref, "k3"), rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- aggregation: the token-sum modes

# VALUES and MASK as in the aggregation section above


def test_aggregate_seq_mean_token_sum():
    # token sums: 1 + 2 = 3 ; 20 + 30 + 40 = 90 -> mean over 2 samples = 46.5
    assert step_denominator([MASK], "seq_mean_token_sum") == 2.0
    assert_close(aggregate(VALUES, MASK, "seq_mean_token_sum", 2.0), torch.tensor(46.5, dtype=F64), rtol=0, atol=1e-12)


def test_aggregate_seq_mean_token_sum_norm():
    # C = 4: (3 / 4 + 90 / 4) / 2 = 93 / 8 = 11.625 ; denominator = 2 samples x 4 = 8
    assert step_denominator([MASK], "seq_mean_token_sum_norm", max_response_len=4) == 8.0
    assert_close(aggregate(VALUES, MASK, "seq_mean_token_sum_norm", 8.0), torch.tensor(11.625, dtype=F64), rtol=0, atol=1e-12)
    # C = 10 -> 93 / 20 = 4.65: the normalizer is a constant, not the sample's length
    assert_close(aggregate(VALUES, MASK, "seq_mean_token_sum_norm", step_denominator([MASK], "seq_mean_token_sum_norm", 10)),
                 torch.tensor(4.65, dtype=F64), rtol=0, atol=1e-12)


def test_seq_mean_token_sum_norm_needs_the_normalizer():
    with pytest.raises(ValueError, match="max_response_len"):
        step_denominator([MASK], "seq_mean_token_sum_norm")
    with pytest.raises(ValueError):
        step_denominator([MASK], "seq_mean")


# Step of 3 samples split [s0] + [s1, s2]; token sums 3, 11, 7 (STEP_V / STEP_M above)
#   seq_mean_token_sum: (3 + 11 + 7) / 3 = 7 ; micro-batches: 3/3 + 18/3 = 1 + 6 = 7
#   seq_mean_token_sum_norm, C = 3: 21 / 9 = 7/3 ; micro-batches: 3/9 + 18/9 = 21/9


@pytest.mark.parametrize("mode,whole", [("seq_mean_token_sum", 7.0), ("seq_mean_token_sum_norm", 7.0 / 3.0)])
def test_token_sum_modes_sum_exactly_over_micro_batches(mode, whole):
    mbs = [(STEP_V[:1], STEP_M[:1]), (STEP_V[1:], STEP_M[1:])]
    denom = step_denominator([m for _, m in mbs], mode, max_response_len=3)
    assert denom == (3.0 if mode == "seq_mean_token_sum" else 9.0)
    total = sum(aggregate(v, m, mode, denom) for v, m in mbs)
    assert_close(total, torch.tensor(whole, dtype=F64), rtol=0, atol=1e-12)


def test_metric_aggregation():
    # fractions stay fractions: token-sum modes report metrics as per-sample token means
    assert metric_aggregation("token_mean") == "token_mean"
    for mode in ("sample_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        assert metric_aggregation(mode) == "sample_token_mean"


def test_float64_logits_keep_float64():
    # logits [0, ln 3] -> probs [1/4, 3/4]; float64 in, float64 out (the invariance tests rely on it)
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=F64)
    lp = log_probs_from_logits(logits, torch.tensor([[1]]))
    assert lp.dtype == F64
    assert_close(lp, t([[math.log(0.75)]]), rtol=0, atol=1e-15)
    assert entropy_from_logits(logits).dtype == F64
