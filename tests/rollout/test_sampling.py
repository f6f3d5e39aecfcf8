"""Hand-derived checks of temperature / top-k / top-p sampling.

Rule in filter_logits: after sorting descending, a token is dropped when the probability mass
strictly BEFORE it (exclusive cumulative sum) is >= top_p; so the first token always stays.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from slime_hydra.rollout.sampling import filter_logits, inverse_cdf, sample_tokens

NEG_INF = float("-inf")


def _kept(logits):
    return torch.isfinite(logits)


# --------------------------------------------------------------------------- top-k


def test_top_k_keeps_exactly_k():
    # row 0: values 1, 4, 2, 3, 0.5 -> top-2 are 4 (idx 1) and 3 (idx 3)
    # row 1: values 5, -1, 0, 2, 1  -> top-2 are 5 (idx 0) and 2 (idx 3)
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0, 0.5], [5.0, -1.0, 0.0, 2.0, 1.0]])
    out = filter_logits(logits, top_k=2, top_p=1.0)
    expected = torch.tensor([[NEG_INF, 4.0, NEG_INF, 3.0, NEG_INF], [5.0, NEG_INF, NEG_INF, 2.0, NEG_INF]])
    assert_close(out, expected, rtol=0, atol=0)
    assert _kept(out).sum(-1).tolist() == [2, 2]

    # top-3 of row 0: 4, 3, 2 -> idx 1, 3, 2 ; of row 1: 5, 2, 1 -> idx 0, 3, 4
    out3 = filter_logits(logits, top_k=3, top_p=1.0)
    assert _kept(out3).tolist() == [[False, True, True, True, False], [True, False, False, True, True]]


@pytest.mark.parametrize("k", [-1, 0, 5, 9])
def test_top_k_off_or_at_least_vocab_is_identity(k):
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0, 0.5]])
    assert_close(filter_logits(logits, top_k=k, top_p=1.0), logits, rtol=0, atol=0)


# --------------------------------------------------------------------------- top-p

# probs 0.5, 0.3, 0.15, 0.05 placed in a shuffled order: [0.15, 0.5, 0.05, 0.3]
# sorted descending: 0.5 (idx 1), 0.3 (idx 3), 0.15 (idx 0), 0.05 (idx 2)
# mass before each (sorted): 0, 0.5, 0.8, 0.95
PROBS = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
LOGITS = PROBS.log()


def test_top_p_keeps_the_two_most_likely():
    # top_p 0.75: drop where mass-before >= 0.75 -> 0.8 and 0.95 dropped -> keep 0.5 (idx 1) and 0.3 (idx 3).
    # (top_p = 0.8 sits exactly on the 0.5 + 0.3 boundary, where the float rounding of the sum decides;
    #  0.75 is chosen to test the same "first two" outcome away from that edge.)
    out = filter_logits(LOGITS, top_k=-1, top_p=0.75)
    assert _kept(out).tolist() == [[False, True, False, True]]
    # kept logits are unchanged
    assert_close(out[0, [1, 3]], LOGITS[0, [1, 3]], rtol=0, atol=0)


def test_top_p_keeps_three():
    # top_p 0.85: only mass-before 0.95 >= 0.85 -> drop 0.05 (idx 2), keep idx 1, 3, 0
    out = filter_logits(LOGITS, top_k=-1, top_p=0.85)
    assert _kept(out).tolist() == [[True, True, False, True]]


def test_top_p_first_token_always_stays():
    # top_p 0.4: mass-before of the second token is 0.5 >= 0.4 -> only the top token (idx 1) stays
    assert _kept(filter_logits(LOGITS, top_k=-1, top_p=0.4)).tolist() == [[False, True, False, False]]
    # a tiny top_p: mass-before of the first token is 0 < 1e-3 -> it stays, alone
    assert _kept(filter_logits(LOGITS, top_k=-1, top_p=1e-3)).tolist() == [[False, True, False, False]]


def test_top_p_exact_boundary_uses_ge():
    # 4 equal logits: probs exactly 0.25 each (binary-exact), mass-before 0, 0.25, 0.5, 0.75 exactly.
    # top_p 0.5  -> third token (mass-before 0.5 >= 0.5) dropped -> exactly 2 kept
    # top_p 0.75 -> fourth token (0.75 >= 0.75) dropped -> exactly 3 kept
    # top_p 0.76 -> nothing dropped -> 4 kept
    logits = torch.zeros(1, 4)
    assert _kept(filter_logits(logits, -1, 0.5)).sum().item() == 2
    assert _kept(filter_logits(logits, -1, 0.75)).sum().item() == 3
    assert _kept(filter_logits(logits, -1, 0.76)).sum().item() == 4


def test_top_p_off_is_identity():
    assert_close(filter_logits(LOGITS, top_k=-1, top_p=1.0), LOGITS, rtol=0, atol=0)


def test_top_p_rows_are_independent():
    # row 0 as above with top_p 0.75 -> keep idx 1, 3
    # row 1: probs [0.7, 0.1, 0.1, 0.1] -> sorted mass-before 0, 0.7, 0.8, 0.9
    #        0.7 < 0.75 keeps the second-ranked token too, 0.8 >= 0.75 drops the rest -> exactly 2 kept:
    #        idx 0 and one of the three tied 0.1s (which one depends on the sort's tie order)
    logits = torch.cat([LOGITS, torch.tensor([[0.7, 0.1, 0.1, 0.1]]).log()])
    out = filter_logits(logits, top_k=-1, top_p=0.75)
    assert _kept(out)[0].tolist() == [False, True, False, True]
    assert _kept(out)[1].sum().item() == 2 and bool(_kept(out)[1, 0])


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    # probs 0.5, 0.3, 0.15, 0.05 (in order), top_p 0.83
    # top_p alone: mass-before 0, 0.5, 0.8, 0.95 -> 0.8 < 0.83 keeps three
    # top_k = 3 first: renormalised 0.5/0.95, 0.3/0.95, 0.15/0.95 = 0.5263, 0.3158, 0.1579
    #   mass-before of the third = 0.8/0.95 = 0.8421 >= 0.83 -> dropped -> keeps two
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert _kept(filter_logits(logits, top_k=-1, top_p=0.83)).tolist() == [[True, True, True, False]]
    assert _kept(filter_logits(logits, top_k=3, top_p=0.83)).tolist() == [[True, True, False, False]]


# --------------------------------------------------------------------------- sample_tokens

LN = [math.log(k) for k in (1.0, 2.0, 3.0, 4.0)]  # logits [0, ln2, ln3, ln4] -> probs [.1, .2, .3, .4] at T = 1


def test_top_k_1_is_argmax_with_full_vocab_log_prob():
    # row 0: [0, ln2, ln3, ln4]  -> argmax idx 3, p = 4/10 -> ln 0.4
    # row 1: [ln3, ln4, 0, ln2]  -> argmax idx 1, p = 0.4
    logits = torch.tensor([LN, [LN[2], LN[3], LN[0], LN[1]]])
    tok, lp = sample_tokens(logits, temperature=1.0, top_k=1, top_p=1.0)
    assert tok.tolist() == [3, 1]
    assert_close(lp, torch.tensor([math.log(0.4), math.log(0.4)]), rtol=0, atol=1e-6)

    # temperature 0.5: scaled logits 2*ln k -> weights k^2 = [1, 4, 9, 16], Z = 30 -> ln(16/30)
    tok, lp = sample_tokens(logits, temperature=0.5, top_k=1, top_p=1.0)
    assert tok.tolist() == [3, 1]
    assert_close(lp, torch.tensor([math.log(16 / 30)] * 2), rtol=0, atol=1e-6)


def test_very_low_temperature_is_argmax():
    # Row i is a permutation of 0, 0.1, ..., 1.9 (20 tokens): distinct values 0.1 apart, so at T = 1e-4
    # the runner-up sits 0.1 / 1e-4 = 1000 nats below the max: exp(-1000) == 0 -> one-hot probs.
    # The argmax is where the value 1.9 (= rank 19) was put.
    g_perm = torch.Generator().manual_seed(123)
    perms = torch.stack([torch.randperm(20, generator=g_perm) for _ in range(8)])  # [8, 20]
    logits = perms.float() * 0.1
    argmax = (perms == 19).nonzero()[:, 1]
    # 64 copies of the 8 rows -> 512 draws per call, 5 seeded calls per setting (2560 draws each)
    logits, argmax = logits.repeat(64, 1), argmax.repeat(64)
    for top_k, top_p in ((-1, 1.0), (5, 0.9)):
        for seed in range(5):
            g = torch.Generator().manual_seed(seed)
            tok, lp = sample_tokens(logits, temperature=1e-4, top_k=top_k, top_p=top_p, generator=g)
            assert torch.equal(tok, argmax)
            # log-prob of a one-hot choice: -log(1 + sum exp(<= -1000)) = 0
            assert_close(lp, torch.zeros(512), rtol=0, atol=1e-6)


def test_log_prob_is_over_full_vocab_top_k():
    # T = 0.5, logits [0, ln2, ln3, ln4] -> weights [1, 4, 9, 16], Z = 30.
    # top_k 2 keeps idx 2, 3: draws only from {2, 3} with renormalised probs 9/25 = 0.36, 16/25 = 0.64,
    # but the returned log-prob is over the FULL vocabulary: ln(9/30) = -1.2039728, ln(16/30) = -0.6286087
    # (NOT ln(9/25) = -1.0216512 / ln(16/25) = -0.4462871).
    n = 4000
    logits = torch.tensor([LN]).expand(n, 4).contiguous()
    g = torch.Generator().manual_seed(7)
    tok, lp = sample_tokens(logits, temperature=0.5, top_k=2, top_p=1.0, generator=g)
    assert set(tok.tolist()) == {2, 3}
    full = torch.tensor([math.log(1 / 30), math.log(4 / 30), math.log(9 / 30), math.log(16 / 30)])
    assert_close(lp, full[tok], rtol=0, atol=1e-6)
    # frequency of idx 3 ~ 0.64; binomial std sqrt(.36 * .64 / 4000) = 0.0076, so +-0.04 is > 5 sigma
    assert abs((tok == 3).float().mean().item() - 0.64) < 0.04


def test_log_prob_is_over_full_vocab_top_p():
    # T = 1: probs [.1, .2, .3, .4]; sorted .4, .3, .2, .1, mass-before 0, .4, .7, .9
    # top_p 0.6 drops mass-before >= 0.6 -> keeps idx 3 (0.4) and idx 2 (0.3)
    # returned log-probs: ln 0.4 = -0.9162907 or ln 0.3 = -1.2039728 (full vocabulary)
    # renormalised draw probs: 0.4/0.7 = 0.5714 for idx 3
    n = 4000
    logits = torch.tensor([LN]).expand(n, 4).contiguous()
    g = torch.Generator().manual_seed(11)
    tok, lp = sample_tokens(logits, temperature=1.0, top_k=-1, top_p=0.6, generator=g)
    assert set(tok.tolist()) == {2, 3}
    full = torch.tensor([math.log(0.1), math.log(0.2), math.log(0.3), math.log(0.4)])
    assert_close(lp, full[tok], rtol=0, atol=1e-6)
    assert abs((tok == 3).float().mean().item() - 0.4 / 0.7) < 0.04


def test_sample_tokens_shapes_and_dtypes():
    logits = torch.zeros(3, 5, dtype=torch.bfloat16)
    tok, lp = sample_tokens(logits, temperature=1.0, top_k=-1, top_p=1.0, generator=torch.Generator().manual_seed(0))
    assert tok.shape == (3,) and tok.dtype == torch.long
    assert lp.shape == (3,) and lp.dtype == torch.float32
    # uniform over 5 -> ln(1/5) for whichever token
    assert_close(lp, torch.full((3,), -math.log(5.0)), rtol=0, atol=1e-6)


def test_inverse_cdf_by_hand():
    # probs [.1, 0, .3, .6] (cumulative .1, .1, .4, 1.0); a row's draw is the first index whose cumulative mass
    # exceeds u: u = 0 -> 0, .05 -> 0, .1 -> 2 (index 1 has no mass: its cumulative .1 does not exceed .1),
    # .39 -> 2, .4 -> 3, .99 -> 3, and u = 1 (rounding can make u * total reach the total) -> 3, the last with mass
    probs = torch.tensor([[0.1, 0.0, 0.3, 0.6]]).expand(7, 4)
    u = torch.tensor([0.0, 0.05, 0.1, 0.39, 0.4, 0.99, 1.0])
    assert inverse_cdf(probs, u).tolist() == [0, 0, 2, 2, 3, 3, 3]
    # unnormalised rows and trailing zeros: [2, 2, 0, 0] (total 4): u = .5 -> cumulative 2 does not exceed 2 -> 1;
    # u = 1 -> index 1, never the massless 2 or 3
    probs = torch.tensor([[2.0, 2.0, 0.0, 0.0]]).expand(3, 4)
    assert inverse_cdf(probs, torch.tensor([0.25, 0.5, 1.0])).tolist() == [0, 1, 1]


def test_unfiltered_sampling_frequencies():
    # T = 1, logits ln[1, 2, 3, 4] -> probs [.1, .2, .3, .4]; 20000 draws: each frequency within 5 binomial sigmas
    # (sigma <= sqrt(.25 / 20000) = 0.0035); a massless token (logit -inf) is never drawn
    n = 20000
    logits = torch.tensor([LN + [float("-inf")]]).expand(n, 5).contiguous()
    tok, lp = sample_tokens(logits, temperature=1.0, top_k=-1, top_p=1.0, generator=torch.Generator().manual_seed(3))
    freq = torch.bincount(tok, minlength=5).float() / n
    assert freq[4] == 0
    assert_close(freq[:4], torch.tensor([0.1, 0.2, 0.3, 0.4]), rtol=0, atol=5 * 0.0035)
    assert_close(lp, torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4, 1.0]))[tok], rtol=0, atol=1e-6)
