"""Hand-computed learning-rate multipliers.

lr = 1e-3, min_lr = 1e-4 -> floor = 0.1; warmup = 4, total = 14 -> decay span = 10 steps.
Warmup: step s < 4 -> (s + 1) / 4. After: progress p = min(1, (s - 4) / 10).
linear: 0.1 + 0.9 * (1 - p); cosine: 0.1 + 0.9 * 0.5 * (1 + cos(pi p)).
"""

import math

import pytest

from slime_hydra.training.schedule import lr_multiplier

LR, MIN_LR, WARMUP, TOTAL = 1e-3, 1e-4, 4, 14


@pytest.mark.parametrize("style", ["constant", "linear", "cosine"])
def test_warmup_is_linear_ramp(style):
    f = lr_multiplier(style, WARMUP, TOTAL, LR, MIN_LR)
    # steps 0..3 -> 1/4, 2/4, 3/4, 4/4 ; step 4 (p = 0) -> 1 for every style
    assert f(0) == pytest.approx(0.25)
    assert f(1) == pytest.approx(0.5)
    assert f(2) == pytest.approx(0.75)
    assert f(3) == pytest.approx(1.0)
    assert f(4) == pytest.approx(1.0)


def test_constant():
    f = lr_multiplier("constant", WARMUP, TOTAL, LR, MIN_LR)
    for s in (5, 9, 14, 100):
        assert f(s) == 1.0


def test_linear():
    f = lr_multiplier("linear", WARMUP, TOTAL, LR, MIN_LR)
    # s = 6:  p = 0.2 -> 0.1 + 0.9 * 0.8 = 0.82
    # s = 9:  p = 0.5 -> 0.1 + 0.9 * 0.5 = 0.55
    # s = 13: p = 0.9 -> 0.1 + 0.9 * 0.1 = 0.19
    # s = 14: p = 1   -> 0.1 ; s = 50: p clamped to 1 -> 0.1
    assert f(6) == pytest.approx(0.82)
    assert f(9) == pytest.approx(0.55)
    assert f(13) == pytest.approx(0.19)
    assert f(14) == pytest.approx(0.1)
    assert f(50) == pytest.approx(0.1)


def test_cosine():
    f = lr_multiplier("cosine", WARMUP, TOTAL, LR, MIN_LR)
    # s = 6:  p = 0.2, cos(0.2 pi) = 0.8090170 -> 0.5 * 1.8090170 = 0.9045085 -> 0.1 + 0.9 * 0.9045085 = 0.9140576
    # s = 9:  p = 0.5, cos(pi/2) = 0 -> 0.1 + 0.45 = 0.55
    # s = 11: p = 0.7, cos(0.7 pi) = -0.5877853 -> 0.5 * 0.4122147 = 0.2061074 -> 0.1 + 0.1854966 = 0.2854966
    # s = 14: p = 1, cos(pi) = -1 -> 0.1 ; s = 50 -> 0.1
    assert f(6) == pytest.approx(0.9140576, abs=1e-6)
    assert f(9) == pytest.approx(0.55)
    assert f(11) == pytest.approx(0.2854966, abs=1e-6)
    assert f(14) == pytest.approx(0.1)
    assert f(50) == pytest.approx(0.1)


def test_no_warmup_and_zero_floor():
    # warmup 0, total 10, min_lr 0 -> floor 0: linear s = 0 -> 1 ; s = 5 -> 0.5 ; s = 10 -> 0
    f = lr_multiplier("linear", 0, 10, 1e-3, 0.0)
    assert f(0) == pytest.approx(1.0)
    assert f(5) == pytest.approx(0.5)
    assert f(10) == pytest.approx(0.0)
    # cosine, same: s = 5 -> 0.5 * (1 + cos(pi/2)) = 0.5 ; s = 10 -> 0
    g = lr_multiplier("cosine", 0, 10, 1e-3, 0.0)
    assert g(5) == pytest.approx(0.5)
    assert g(10) == pytest.approx(0.0, abs=1e-12)
    # lr = 0 -> floor 0 (no division by zero)
    h = lr_multiplier("linear", 0, 10, 0.0, 0.0)
    assert h(10) == pytest.approx(0.0)


def test_total_not_after_warmup_stays_at_one():
    # total <= warmup: after the ramp the multiplier is 1 (no decay span)
    f = lr_multiplier("cosine", 4, 4, LR, MIN_LR)
    assert f(3) == pytest.approx(1.0)
    assert f(4) == 1.0
    assert f(10) == 1.0


def test_unknown_style():
    f = lr_multiplier("poly", 2, 10, LR, MIN_LR)
    assert f(0) == pytest.approx(0.5)  # warmup does not look at the style
    with pytest.raises(ValueError):
        f(5)
    assert math.isfinite(f(1))
