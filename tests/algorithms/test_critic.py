"""Hand-derived checks of GAE and the clipped value loss (PPO's critic side, not wired into a trainer)."""

import torch
from torch.testing import assert_close

from slime_hydra.algorithms.critic import gae_advantages, value_loss

F64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=F64)


# A 3-token response at positions 1..3 (position 0 is prompt: its 9 / 7 are ignored).
#   V = [0.5, 0.4, 0.2], r = [0, 0, 1] (the reward on the last token), gamma = 0.9, lambd = 0.8
#   t = 3: delta = 1 + 0.9 * 0 - 0.2 = 0.8                 A3 = 0.8
#   t = 2: delta = 0 + 0.9 * 0.2 - 0.4 = -0.22             A2 = -0.22 + 0.72 * 0.8 = 0.356
#   t = 1: delta = 0 + 0.9 * 0.4 - 0.5 = -0.14             A1 = -0.14 + 0.72 * 0.356 = 0.11632
#   returns = A + V: [0.61632, 0.756, 1.0]
MASK = t([[0, 1, 1, 1]])
VALUES = t([[9.0, 0.5, 0.4, 0.2]])
REWARDS = t([[7.0, 0.0, 0.0, 1.0]])


def test_gae_three_tokens_by_hand():
    adv, ret = gae_advantages(VALUES, REWARDS, MASK, gamma=0.9, lambd=0.8)
    assert_close(adv, t([[0, 0.11632, 0.356, 0.8]]), rtol=0, atol=1e-12)
    assert_close(ret, t([[0, 0.61632, 0.756, 1.0]]), rtol=0, atol=1e-12)


def test_gae_lambda_one_returns_are_discounted_rewards():
    # lambd = 1: A2 = -0.22 + 0.9 * 0.8 = 0.5, A1 = -0.14 + 0.9 * 0.5 = 0.31
    # returns = 0.9^2 * 1, 0.9 * 1, 1 = [0.81, 0.9, 1.0] (the values cancel)
    adv, ret = gae_advantages(VALUES, REWARDS, MASK, gamma=0.9, lambd=1.0)
    assert_close(adv, t([[0, 0.31, 0.5, 0.8]]), rtol=0, atol=1e-12)
    assert_close(ret, t([[0, 0.81, 0.9, 1.0]]), rtol=0, atol=1e-12)


def test_gae_lambda_zero_is_the_td_error():
    adv, _ = gae_advantages(VALUES, REWARDS, MASK, gamma=0.9, lambd=0.0)
    assert_close(adv, t([[0, -0.14, -0.22, 0.8]]), rtol=0, atol=1e-12)


def test_gae_value_after_the_last_response_token_is_zero():
    # response at positions 1, 2; position 3 is padding (V = 9 there must not bootstrap)
    #   gamma = lambd = 1: A2 = 2 + 0 - 0.6 = 1.4 ; A1 = (0 + 0.6 - 0.3) + 1.4 = 1.7 ; returns [2.0, 2.0]
    adv, ret = gae_advantages(t([[9.0, 0.3, 0.6, 9.0]]), t([[0.0, 0.0, 2.0, 0.0]]), t([[0, 1, 1, 0]]), 1.0, 1.0)
    assert_close(adv, t([[0, 1.7, 1.4, 0]]), rtol=0, atol=1e-12)
    assert_close(ret, t([[0, 2.0, 2.0, 0]]), rtol=0, atol=1e-12)


# value_clip = 0.2, V_clip = V_old + clamp(V - V_old, -0.2, 0.2), L = max((V_clip - G)^2, (V - G)^2)
#   t0: V 1.0, old 1.0, G 2.0 -> V_clip 1.0: max(1, 1) = 1                      clipfrac 0
#   t1: V 1.5, old 1.0, G 1.0 -> V_clip 1.2: max(0.04, 0.25) = 0.25             clipfrac 1
#   t2: V 0.5, old 1.0, G 1.0 -> V_clip 0.8: max(0.04, 0.25) = 0.25             clipfrac 1
#   t3: V 0.9, old 1.0, G 0.0 -> V_clip 0.9: 0.81                               clipfrac 0
#   t4: V 1.5, old 1.0, G 2.0 -> V_clip 1.2: max(0.64, 0.25) = 0.64 (clipped branch wins) clipfrac 1
V = [1.0, 1.5, 0.5, 0.9, 1.5]
OLD = t([[1.0, 1.0, 1.0, 1.0, 1.0]])
G = t([[2.0, 1.0, 1.0, 0.0, 2.0]])


def test_value_loss_by_hand():
    loss, frac = value_loss(t([V]), OLD, G, value_clip=0.2)
    assert_close(loss, t([[1.0, 0.25, 0.25, 0.81, 0.64]]), rtol=0, atol=1e-12)
    assert frac.tolist() == [[0.0, 1.0, 1.0, 0.0, 1.0]]


def test_value_loss_gradient():
    # dL/dV = 2 (V - G) on the unclipped branch: t0 -2, t1 1, t2 -1, t3 1.8 ; t4 takes the clipped
    # branch, which is flat in V (the clamp saturates): 0
    v = t([V]).requires_grad_()
    loss, _ = value_loss(v, OLD, G, value_clip=0.2)
    loss.sum().backward()
    assert_close(v.grad, t([[-2.0, 1.0, -1.0, 1.8, 0.0]]), rtol=0, atol=1e-12)
