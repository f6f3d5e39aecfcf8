"""The optimizer both backends build (torch's AdamW, its implementation picked by `train.adam_impl`), and the step
both take: clip, then update only when the gradient norm is finite.

A NaN or inf anywhere in the gradient (a non-finite loss, an overflow) makes the global norm non-finite; clipping
would then scale every gradient by NaN and AdamW would write NaN into the weights and its moments, and the next
checkpoint would save them. Such a step is skipped instead, as verl does: no update, the moments untouched, the
learning-rate schedule still advancing; it is counted in `train/skipped_steps` (`train/value_skipped_steps` for the
critic), per rollout.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

SKIPPED_STEPS = "train/skipped_steps"
VALUE_SKIPPED_STEPS = "train/value_skipped_steps"
COUNTED = (SKIPPED_STEPS, VALUE_SKIPPED_STEPS)  # per-step 0/1 metrics a rollout sums rather than averages


def adam_flags(impl: str) -> dict[str, bool]:
    """train.adam_impl -> AdamW's keyword flags: fused (one kernel per parameter group) | foreach | for_loop."""
    return {"fused": impl == "fused", "foreach": impl == "foreach"}


def adamw(params: Iterable[torch.nn.Parameter], impl: str, lr: float, betas: tuple[float, float] = (0.9, 0.999),
          eps: float = 1e-8, weight_decay: float = 0.0) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **adam_flags(impl))


def clip_and_step(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, clip_grad: float) -> tuple[float, bool]:
    """(global gradient norm before clipping, whether the optimizer stepped). clip_grad <= 0: no clipping."""
    norm = float(torch.nn.utils.clip_grad_norm_(params, clip_grad if clip_grad > 0 else float("inf")))
    if not math.isfinite(norm):
        return norm, False
    optimizer.step()
    return norm, True


def megatron_clip_and_step(optimizer) -> tuple[float, bool]:
    """megatron-core's `optimizer.step()` (MixedPrecision / FP32 / Chained optimizer; clipping by each one's
    config.clip_grad) with the finite-norm check between the norm and the update: the same calls in the same order
    otherwise. The norm is the all-reduced one of the model-parallel group, so every rank skips or steps together.
    An fp16 loss-scale overflow (megatron's own check) skips too."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32  # megatron.core: megatron runs only

    if optimizer.prepare_grads():
        return float("inf"), False
    norm = float(optimizer.get_grad_norm() or 0.0)
    if not math.isfinite(norm):
        return norm, False
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        params = opt.get_parameters()
        if opt.config.clip_grad > 0 and params and not getattr(opt, "is_stub_optimizer", False):
            clip_grad_by_total_norm_fp32(params, max_norm=opt.config.clip_grad, total_norm=norm,
                                         use_decoupled_grad=opt.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8)
    optimizer.step_with_ready_grads()
    return norm, True
