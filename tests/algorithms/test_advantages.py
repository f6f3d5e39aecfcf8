"""Hand-derived checks of the advantage estimators (slime semantics): the GRPO family, RLOO, REINFORCE++ (-baseline),
discounted returns, whitening and compute_advantages.

Every expected number is worked out in the comments; none is produced by calling the function
under test another way. RLOO is also compared with a plain loop over groups written from verl's formula.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from slime_hydra.algorithms.advantages import (
    broadcast_to_tokens,
    group_normalize,
    grpo_advantages,
    leave_one_out,
    masked_whiten,
    rloo_estimator,
)
from slime_hydra.algorithms.estimators import compute_advantages
from slime_hydra.algorithms.reinforce import (
    discounted_returns,
    last_token_index,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    token_level_rewards,
)

F64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=F64)


def test_group_normalize_mean_and_unbiased_std():
    # Two groups of G = 4.
    # group 0: r = [1, 2, 3, 4]
    #   mean = 10 / 4 = 2.5; centred = [-1.5, -0.5, 0.5, 1.5]
    #   sum of squares = 2.25 + 0.25 + 0.25 + 2.25 = 5; unbiased var = 5 / (4 - 1) = 5/3
    #   std = sqrt(5/3) = 1.2909944487358056   (the biased std, sqrt(5/4) = 1.118, must NOT be used)
    #   adv = centred / (std + 1e-6)
    # group 1: r = [0, 0, 0, 4]
    #   mean = 1; centred = [-1, -1, -1, 3]
    #   sum of squares = 1 + 1 + 1 + 9 = 12; unbiased var = 12 / 3 = 4; std = 2
    #   adv = centred / (2 + 1e-6)
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 4.0], dtype=F64)
    s0 = math.sqrt(5.0 / 3.0) + 1e-6
    s1 = 2.0 + 1e-6
    expected = torch.tensor(
        [-1.5 / s0, -0.5 / s0, 0.5 / s0, 1.5 / s0, -1.0 / s1, -1.0 / s1, -1.0 / s1, 3.0 / s1], dtype=F64
    )
    out = group_normalize(rewards, group_size=4)
    assert out.shape == (8,)
    assert_close(out, expected, rtol=0, atol=1e-12)
    # sanity on the numbers themselves: -1.5 / 1.29099... = -1.161895...
    assert abs(out[0].item() - (-1.1618950038622251)) < 1e-5


def test_group_normalize_std_off_is_dr_grpo():
    # Dr.GRPO: only the group mean is subtracted.
    # group 0: [1, 2, 3, 4] - 2.5 = [-1.5, -0.5, 0.5, 1.5]
    # group 1: [0, 0, 0, 4] - 1   = [-1, -1, -1, 3]
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 4.0], dtype=F64)
    out = group_normalize(rewards, group_size=4, subtract_mean=True, std_normalize=False)
    assert_close(out, torch.tensor([-1.5, -0.5, 0.5, 1.5, -1.0, -1.0, -1.0, 3.0], dtype=F64), rtol=0, atol=0)


def test_group_normalize_subtract_mean_off():
    # No centring, still divided by the (unbiased) group std + 1e-6.
    # group [0, 0, 0, 4]: std = 2 (see above) -> [0, 0, 0, 4 / (2 + 1e-6)]
    rewards = torch.tensor([0.0, 0.0, 0.0, 4.0], dtype=F64)
    out = group_normalize(rewards, group_size=4, subtract_mean=False, std_normalize=True)
    assert_close(out, torch.tensor([0.0, 0.0, 0.0, 4.0 / (2.0 + 1e-6)], dtype=F64), rtol=0, atol=1e-12)

    # Both off: the rewards come back unchanged (and as a copy, not a view of the input).
    out2 = group_normalize(rewards, group_size=4, subtract_mean=False, std_normalize=False)
    assert_close(out2, rewards, rtol=0, atol=0)
    out2[0] = 123.0
    assert rewards[0].item() == 0.0


def test_group_normalize_agreeing_group_gives_zeros():
    # group 0: [1, 1, 1] -> mean 1, centred [0, 0, 0], std 0 -> 0 / (0 + 1e-6) = 0 (no NaN, no inf)
    # group 1: [0, 1, 2] -> mean 1, centred [-1, 0, 1], var = (1 + 0 + 1) / 2 = 1, std = 1
    #          -> [-1, 0, 1] / (1 + 1e-6)
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 2.0], dtype=F64)
    out = group_normalize(rewards, group_size=3)
    s = 1.0 + 1e-6
    assert torch.isfinite(out).all()
    assert_close(out, torch.tensor([0.0, 0.0, 0.0, -1.0 / s, 0.0, 1.0 / s], dtype=F64), rtol=0, atol=1e-12)

    # Same with std off (Dr.GRPO): still exact zeros for the agreeing group.
    out_dr = group_normalize(rewards, group_size=3, std_normalize=False)
    assert_close(out_dr, torch.tensor([0.0, 0.0, 0.0, -1.0, 0.0, 1.0], dtype=F64), rtol=0, atol=0)


def test_group_normalize_groups_are_consecutive_blocks():
    # Samples of one prompt are consecutive: [a0, a1, b0, b1] with G = 2.
    # group a = [0, 2]: mean 1, centred [-1, 1], var = 2 / 1 = 2, std = sqrt(2)
    # group b = [5, 5]: zeros
    rewards = torch.tensor([0.0, 2.0, 5.0, 5.0], dtype=F64)
    out = group_normalize(rewards, group_size=2)
    s = math.sqrt(2.0) + 1e-6
    assert_close(out, torch.tensor([-1.0 / s, 1.0 / s, 0.0, 0.0], dtype=F64), rtol=0, atol=1e-12)


def test_broadcast_to_tokens():
    # values [2, -3]; masks put the value on masked positions and 0 elsewhere.
    values = torch.tensor([2.0, -3.0])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0]])
    out = broadcast_to_tokens(values, mask)
    expected = torch.tensor([[0.0, 2.0, 2.0, 0.0], [-3.0, 0.0, -3.0, -3.0]])
    assert out.shape == (2, 4)
    assert out.dtype == mask.dtype
    assert_close(out, expected, rtol=0, atol=0)


def test_broadcast_to_tokens_casts_to_mask_dtype():
    # float64 values onto a float32 mask -> float32 result.
    values = torch.tensor([0.5], dtype=F64)
    mask = torch.tensor([[1.0, 0.0]], dtype=torch.float32)
    out = broadcast_to_tokens(values, mask)
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor([[0.5, 0.0]]), rtol=0, atol=0)


def test_grpo_advantages_with_std():
    # One group of G = 2: rewards [1, 0]
    #   mean 0.5, centred [0.5, -0.5], unbiased var = (0.25 + 0.25) / 1 = 0.5, std = sqrt(0.5)
    #   adv = [0.5, -0.5] / (sqrt(0.5) + 1e-6) = [0.70710..., -0.70710...]
    # broadcast onto the response positions of each row.
    rewards = torch.tensor([1.0, 0.0], dtype=F64)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]], dtype=F64)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = torch.tensor([[0.0, a, a], [0.0, 0.0, -a]], dtype=F64)
    out = grpo_advantages(rewards, mask, group_size=2, std_normalize=True)
    assert_close(out, expected, rtol=0, atol=1e-12)
    assert abs(a - 0.7071057) < 1e-6


def test_grpo_advantages_without_std():
    # Same rewards, Dr.GRPO: adv = [0.5, -0.5] exactly.
    rewards = torch.tensor([1.0, 0.0], dtype=F64)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]], dtype=F64)
    expected = torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, -0.5]], dtype=F64)
    out = grpo_advantages(rewards, mask, group_size=2, std_normalize=False)
    assert_close(out, expected, rtol=0, atol=0)


# --------------------------------------------------------------------------- RLOO


def test_leave_one_out_by_hand():
    # group 0, G = 4: r = [1, 2, 4, 9], sum 16
    #   baselines (16 - r_i) / 3 = [15/3, 14/3, 12/3, 7/3] = [5, 4.6667, 4, 2.3333]
    #   r_i - baseline = [1 - 5, 2 - 14/3, 4 - 4, 9 - 7/3] = [-4, -8/3, 0, 20/3]
    #   the same as G/(G-1) * (r - mean): mean 4, r - mean = [-3, -2, 0, 5], times 4/3 = [-4, -8/3, 0, 20/3]
    # group 1, G = 4: r = [0.7] * 4, tied: exactly 0
    out = leave_one_out(t([1.0, 2.0, 4.0, 9.0, 0.7, 0.7, 0.7, 0.7]), group_size=4)
    assert_close(out, t([-4.0, -8.0 / 3.0, 0.0, 20.0 / 3.0, 0, 0, 0, 0]), rtol=0, atol=1e-12)
    assert torch.equal(out[4:], torch.zeros(4, dtype=F64))
    assert abs(out[:4].sum().item()) < 1e-12  # the baseline is unbiased: advantages sum to 0 over the group


def test_leave_one_out_group_of_two_and_group_of_one():
    # G = 2: each sample's baseline is the other's reward: [3 - (-1), -1 - 3] = [4, -4]
    assert leave_one_out(t([3.0, -1.0]), group_size=2).tolist() == [4.0, -4.0]
    # G = 1: no other sample, baseline 0 (verl): the raw rewards
    assert leave_one_out(t([3.0, -1.0]), group_size=1).tolist() == [3.0, -1.0]


def test_leave_one_out_tied_float32_groups_are_exactly_zero_and_finite():
    # eight float32 5.3s: the mean is one ulp off 5.3, so the plain formula leaves a residue; the tied group gets 0
    r = torch.full((8,), 5.3)
    assert (r - r.mean()).abs().max() > 0
    assert torch.equal(leave_one_out(r, group_size=8), torch.zeros(8))
    # large finite rewards stay finite: |G/(G-1) * (r - mean)| <= 2 * 2 * 1e30 in float32 (max 3.4e38)
    big = torch.tensor([1e30, -1e30, 1e30, -1e30])
    out = leave_one_out(big, group_size=4)
    assert torch.isfinite(out).all()
    assert_close(out, torch.tensor([4e30, -4e30, 4e30, -4e30]) / 3, rtol=1e-6, atol=0)  # 4/3 * (+-1e30 - 0)


def test_rloo_estimator_on_every_response_token():
    # G = 2, R = [1, 0]: [1 - 0, 0 - 1] = [1, -1] on the masked tokens; the shaped KL is not read
    mask = t([[0, 1, 1], [0, 0, 1]])
    out = rloo_estimator(t([1.0, 0.0]), mask, t([[5, 5, 5], [5, 5, 5]]), 2, rewards_normalization=True)
    assert out.tolist() == [[0, 1, 1], [0, 0, -1]]
    # rewards_normalization off: raw rewards, as for every group baseline
    raw = rloo_estimator(t([1.0, 0.0]), mask, None, 2, rewards_normalization=False)
    assert raw.tolist() == [[0, 1, 1], [0, 0, 0]]


def verl_rloo(scores: list[float], index: list[int]) -> list[float]:
    """verl's compute_rloo_outcome_advantage (verl/trainer/ppo/core_algos.py) on one scalar score per sample,
    written as a plain loop over groups: baseline 0 for a group of one, else s * n / (n - 1) - mean * n / (n - 1)."""
    groups: dict[int, list[float]] = {}
    for s, i in zip(scores, index):
        groups.setdefault(i, []).append(s)
    out = []
    for s, i in zip(scores, index):
        n = len(groups[i])
        mean = sum(groups[i]) / n if n > 1 else 0.0
        out.append(s * n / (n - 1) - mean * n / (n - 1) if n > 1 else s)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("group_size", [1, 2, 3, 4, 8])
def test_leave_one_out_matches_verls_formula(group_size, dtype):
    g = torch.Generator().manual_seed(group_size)
    rewards = (torch.randn(6 * group_size, generator=g, dtype=F64) * 3).to(dtype)  # [N], 6 groups
    rewards[:group_size] = 0.5  # one tied group
    index = [i // group_size for i in range(len(rewards))]
    expected = torch.tensor(verl_rloo(rewards.tolist(), index), dtype=dtype)
    # float rounding: the loop runs in float64 on dtype's rewards; ours in dtype: a few ulp of G/(G-1) * 2 max|r|
    tol = 8 * torch.finfo(dtype).eps * 2 * rewards.abs().max().item()
    assert_close(leave_one_out(rewards, group_size), expected, rtol=0, atol=tol)


# --------------------------------------------------------------------------- REINFORCE++, returns, whitening, compute_advantages

# Layout (training/batch.py): [N, T] rows, position t predicts token t+1, the response positions are
# contiguous, `mask` is the loss mask. The example rows below:
#   row 0: mask [0, 1, 0, 1, 1]  position 0 is prompt, position 2 a masked-out response token
#   row 1: mask [0, 0, 1, 1, 0]  a shorter response, position 4 is padding
# Values off the mask (9.0) are there to show they are ignored.
MASK = t([[0, 1, 0, 1, 1], [0, 0, 1, 1, 0]])
KL = t([[9.0, 0.2, 5.0, 0.4, 0.1], [9.0, 9.0, 0.3, 0.5, 9.0]])


def test_last_token_index():
    # last masked position: row 0 -> 4, row 1 -> 3; a row with no trained token -> 0
    assert last_token_index(MASK).tolist() == [4, 3]
    assert last_token_index(t([[0, 0, 0]])).tolist() == [0]


def test_token_level_rewards():
    # r_t = -kl_coef * kl_t * mask_t, kl_coef = 0.5, plus R at the last valid token
    #   row 0: [0, -0.1, 0, -0.2, -0.05] + R = 1 at 4  -> [0, -0.1, 0, -0.2, 0.95]
    #   row 1: [0, 0, -0.15, -0.25, 0]  + R = -1 at 3 -> [0, 0, -0.15, -1.25, 0]
    r = token_level_rewards(t([1.0, -1.0]), MASK, KL, kl_coef=0.5)
    assert_close(r, t([[0, -0.1, 0, -0.2, 0.95], [0, 0, -0.15, -1.25, 0]]), rtol=0, atol=1e-12)
    # no KL (kl_coef = 0 leaves it out): only R at the last token; an empty row gets nothing
    r0 = token_level_rewards(t([2.0, 3.0]), t([[1, 1, 0], [0, 0, 0]]), None, kl_coef=0.0)
    assert_close(r0, t([[0, 2.0, 0], [0, 0, 0]]), rtol=0, atol=0)


def test_discounted_returns_by_hand():
    # gamma = 0.5, G_t = r_t + 0.5 G_{t+1}
    #   row [0, -0.1, 0, -0.2, 0.95]: G4 = 0.95, G3 = -0.2 + 0.475 = 0.275, G2 = 0.1375,
    #                                 G1 = -0.1 + 0.06875 = -0.03125, G0 = -0.015625
    #   row [0, 0, -0.15, -1.25, 0]:  G4 = 0, G3 = -1.25, G2 = -0.15 - 0.625 = -0.775, G1 = -0.3875, G0 = -0.19375
    r = t([[0, -0.1, 0, -0.2, 0.95], [0, 0, -0.15, -1.25, 0]])
    expected = t([[-0.015625, -0.03125, 0.1375, 0.275, 0.95], [-0.19375, -0.3875, -0.775, -1.25, 0.0]])
    assert_close(discounted_returns(r, 0.5), expected, rtol=0, atol=1e-12)
    # gamma = 1: suffix sums. gamma = 0: the rewards themselves.
    assert_close(discounted_returns(t([[1.0, 2.0, 3.0]]), 1.0), t([[6.0, 5.0, 3.0]]), rtol=0, atol=0)
    assert_close(discounted_returns(t([[1.0, 2.0, 3.0]]), 0.0), t([[1.0, 2.0, 3.0]]), rtol=0, atol=0)


def test_reinforce_plus_plus_advantages():
    # the returns above on the mask: the masked-out position 2 of row 0 still discounts once
    # (G1 = -0.1 + 0.5 * G2 with G2 = 0.5 * G3), as slime steps through every response token
    adv = reinforce_plus_plus_advantages(t([1.0, -1.0]), MASK, KL, kl_coef=0.5, gamma=0.5)
    assert_close(adv, t([[0, -0.03125, 0, 0.275, 0.95], [0, 0, -0.775, -1.25, 0]]), rtol=0, atol=1e-12)


def test_reinforce_plus_plus_gamma_one_no_kl_is_the_reward_on_every_token():
    adv = reinforce_plus_plus_advantages(t([1.0, -1.0]), MASK, None, kl_coef=0.0, gamma=1.0)
    assert_close(adv, t([[0, 1, 0, 1, 1], [0, 0, -1, -1, 0]]), rtol=0, atol=0)


def test_reinforce_plus_plus_baseline_advantages():
    # group of 2, R = [3, 1]: mean 2 -> centred [1, -1]; A_t = centred - 0.5 * kl_t on the mask
    #   row 0: 1 - 0.1 = 0.9, 1 - 0.2 = 0.8, 1 - 0.05 = 0.95
    #   row 1: -1 - 0.15 = -1.15, -1 - 0.25 = -1.25
    adv = reinforce_plus_plus_baseline_advantages(t([3.0, 1.0]), MASK, KL, kl_coef=0.5, group_size=2)
    assert_close(adv, t([[0, 0.9, 0, 0.8, 0.95], [0, 0, -1.15, -1.25, 0]]), rtol=0, atol=1e-12)
    # rewards_normalization off: raw R = 3 and 1 -> row 0: 2.9, 2.8, 2.95 ; row 1: 0.85, 0.75
    raw = reinforce_plus_plus_baseline_advantages(t([3.0, 1.0]), MASK, KL, 0.5, 2, subtract_mean=False)
    assert_close(raw, t([[0, 2.9, 0, 2.8, 2.95], [0, 0, 0.85, 0.75, 0]]), rtol=0, atol=1e-12)
    # no KL: the centred reward broadcast (never divided by the group std)
    assert_close(reinforce_plus_plus_baseline_advantages(t([3.0, 1.0]), MASK, None, 0.0, 2),
                 t([[0, 1, 0, 1, 1], [0, 0, -1, -1, 0]]), rtol=0, atol=0)


# --------------------------------------------------------------------------- whitening

# masked values 1, 2, 3 (row 0) and 4, 6 (row 1); off-mask 100s are ignored. n = 5
#   mean = 16 / 5 = 3.2 ; E[v^2] = (1 + 4 + 9 + 16 + 36) / 5 = 13.2 ; var = 13.2 - 10.24 = 2.96
#   Bessel: 2.96 * 5 / 4 = 3.7 ; whitened = (v - 3.2) / sqrt(3.7 + 1e-8)
WV = t([[100, 1, 100, 2, 3], [100, 100, 4, 6, 100]])


def test_masked_whiten_by_hand():
    s = math.sqrt(3.7 + 1e-8)
    expected = t([[0, (1 - 3.2) / s, 0, (2 - 3.2) / s, (3 - 3.2) / s], [0, 0, (4 - 3.2) / s, (6 - 3.2) / s, 0]])
    out = masked_whiten(WV, MASK)
    assert_close(out, expected, rtol=0, atol=1e-12)
    assert abs((out * MASK).sum().item()) < 1e-12  # zero mean over the masked tokens
    assert abs(out[0, 1].item() + 1.1437255) < 1e-6  # -2.2 / 1.9235384


def test_masked_whiten_without_mean_shift_adds_it_back():
    s = math.sqrt(3.7 + 1e-8)
    out = masked_whiten(WV, MASK, shift_mean=False)
    assert_close(out[1, 3], torch.tensor((6 - 3.2) / s + 3.2, dtype=F64), rtol=0, atol=1e-12)


def test_masked_whiten_single_token_and_empty():
    # n = 1: no Bessel correction, var = 0 -> (v - v) * rsqrt(1e-8) = 0
    assert masked_whiten(t([[5.0, 7.0]]), t([[0, 1]])).tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError):
        masked_whiten(t([[5.0]]), t([[0]]))


# --------------------------------------------------------------------------- compute_advantages

GRPO_MASK = t([[0, 1, 1], [0, 0, 1]])


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "cispo"])
def test_compute_advantages_grpo_family(estimator):
    # group of 2, R = [1, 0]: centred [0.5, -0.5], unbiased std sqrt(0.5) -> +-0.5 / (sqrt(0.5) + 1e-6)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    out = compute_advantages(estimator, t([1.0, 0.0]), GRPO_MASK, None, 2)
    assert_close(out, t([[0, a, a], [0, 0, -a]]), rtol=0, atol=1e-12)
    # std off (Dr.GRPO): +-0.5 ; the shaped KL is ignored by this family, as in slime
    dr = compute_advantages(estimator, t([1.0, 0.0]), GRPO_MASK, t([[1, 1, 1], [1, 1, 1]]), 2, grpo_std_normalization=False,
                            kl_coef=0.3)
    assert_close(dr, t([[0, 0.5, 0.5], [0, 0, -0.5]]), rtol=0, atol=0)
    # rewards_normalization off: raw rewards, and no std division either (slime's reward post-processing)
    raw = compute_advantages(estimator, t([1.0, 0.0]), GRPO_MASK, None, 2, rewards_normalization=False)
    assert_close(raw, t([[0, 1, 1], [0, 0, 0]]), rtol=0, atol=0)


def test_compute_advantages_rloo():
    # G = 3, R = [3, 0, 0]: mean 1, 3/2 * [2, -1, -1] = [3, -1.5, -1.5] on every response token
    mask = t([[1, 1], [0, 1], [1, 0]])
    out = compute_advantages("rloo", t([3.0, 0.0, 0.0]), mask, None, 3)
    assert out.tolist() == [[3.0, 3.0], [0.0, -1.5], [-1.5, 0.0]]


def test_compute_advantages_reinforce_plus_plus_whitened():
    # the REINFORCE++ advantages [-0.03125, 0.275, 0.95 | -0.775, -1.25], then whitened over those 5 tokens
    raw = reinforce_plus_plus_advantages(t([1.0, -1.0]), MASK, KL, 0.5, 0.5)
    out = compute_advantages("reinforce_plus_plus", t([1.0, -1.0]), MASK, KL, 2, kl_coef=0.5, gamma=0.5,
                             normalize_advantages=True)
    assert_close(out, masked_whiten(raw, MASK), rtol=0, atol=1e-12)
    vals = [-0.03125, 0.275, 0.95, -0.775, -1.25]
    mean = sum(vals) / 5  # -0.16625
    var = (sum(v * v for v in vals) / 5 - mean**2) * 5 / 4
    assert_close(out[0, 4], torch.tensor((0.95 - mean) / math.sqrt(var + 1e-8), dtype=F64), rtol=0, atol=1e-12)


def test_compute_advantages_reinforce_plus_plus_baseline():
    out = compute_advantages("reinforce_plus_plus_baseline", t([3.0, 1.0]), MASK, KL, 2, kl_coef=0.5)
    assert_close(out, t([[0, 0.9, 0, 0.8, 0.95], [0, 0, -1.15, -1.25, 0]]), rtol=0, atol=1e-12)


def test_compute_advantages_custom_replaces_the_estimator_and_is_masked():
    seen = {}

    def custom(rewards, mask, kl, group_size):
        seen["args"] = (rewards.tolist(), group_size, kl is None)
        return torch.full(mask.shape, 2.0, dtype=F64)

    out = compute_advantages("grpo", t([1.0, 0.0]), GRPO_MASK, None, 2, custom=custom)
    assert seen["args"] == ([1.0, 0.0], 2, True)
    assert_close(out, t([[0, 2, 2], [0, 0, 2]]), rtol=0, atol=0)
    # whitening still applies after a custom estimator: constant values whiten to 0
    assert compute_advantages("grpo", t([1.0, 0.0]), GRPO_MASK, None, 2, custom=custom, normalize_advantages=True).abs().max() == 0


def test_compute_advantages_unknown_estimator():
    with pytest.raises(ValueError, match="ppo"):
        compute_advantages("ppo", t([1.0, 0.0]), GRPO_MASK, None, 2)
