"""Hand-derived checks of GSPO, CISPO, TIS, the unbiased KL and the token-sum aggregation modes.

Conventions (slime): ppo_kl = old - new, ratio = exp(-ppo_kl). Every expected number is worked out
in the comments; gradients are checked where the stop-gradient placement is the point.
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
    step_denominator,
    unbiased_kl_estimate,
)
from slime_hydra.algorithms.surrogates import cispo_loss, gspo_loss, sequence_mean_log_ratio, tis_weights

F64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=F64)


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


# --------------------------------------------------------------------------- aggregation modes

VALUES = t([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]])
MASK = t([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]])


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


# Step of 3 samples split [s0] + [s1, s2]; token sums 3, 11, 7 (see tests/test_losses.py STEP_V / STEP_M)
#   seq_mean_token_sum: (3 + 11 + 7) / 3 = 7 ; micro-batches: 3/3 + 18/3 = 1 + 6 = 7
#   seq_mean_token_sum_norm, C = 3: 21 / 9 = 7/3 ; micro-batches: 3/9 + 18/9 = 21/9
STEP_V = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
STEP_M = t([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


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
