"""Learning-rate schedules as plain multiplier functions of the optimizer step."""

from __future__ import annotations

import math
from typing import Callable


def lr_multiplier(style: str, warmup: int, total: int, lr: float, min_lr: float) -> Callable[[int], float]:
    floor = min_lr / lr if lr > 0 else 0.0

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if style == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if style == "linear":
            return floor + (1 - floor) * (1 - progress)
        if style == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        raise ValueError(f"unknown lr_decay_style {style!r}")

    return f
