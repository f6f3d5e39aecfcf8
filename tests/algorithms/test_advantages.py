"""Hand-derived checks of the GRPO-family advantage estimators (slime semantics).

Every expected number is worked out in the comments; none is produced by calling the function
under test another way.
"""

import math

import torch
from torch.testing import assert_close

from slime_hydra.algorithms.advantages import broadcast_to_tokens, group_normalize, grpo_advantages

F64 = torch.float64


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
