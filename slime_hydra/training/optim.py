"""The optimizer both backends build: torch's AdamW, its implementation picked by `train.adam_impl`."""

from __future__ import annotations

from typing import Iterable

import torch


def adam_flags(impl: str) -> dict[str, bool]:
    """train.adam_impl -> AdamW's keyword flags: fused (one kernel per parameter group) | foreach | for_loop."""
    return {"fused": impl == "fused", "foreach": impl == "foreach"}


def adamw(params: Iterable[torch.nn.Parameter], impl: str, lr: float, betas: tuple[float, float] = (0.9, 0.999),
          eps: float = 1e-8, weight_decay: float = 0.0) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **adam_flags(impl))
