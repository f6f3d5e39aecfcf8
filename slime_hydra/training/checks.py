"""Checks of the keys the torch trainer (training/torch_backend.py, train.backend=torch) reads or cannot run.

Called by the composition floor (app/checks.py) with the groups they read, before anything is built.
- No model parallelism: every parallelism size must be one.
- Half precision without an fp32 copy: the trainer updates the weights in model.dtype itself, so an AdamW step
  (about train.lr per element) smaller than half a bf16 step of the weight rounds away. A warning: the run is
  wasted, not harmful (benchmarks that only time a step do this on purpose).
"""

from __future__ import annotations

from typing import Optional

from slime_hydra.config.schema import ModelConfig, ParallelismConfig, TrainConfig

MANTISSA_BITS = {"bfloat16": 8, "float16": 11}  # significant bits (implicit one included)
MEDIAN_ABS_NORMAL = 0.6745  # median |w| of w ~ N(0, s) is 0.6745 s


def check(p: ParallelismConfig) -> list[str]:
    if (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size, p.expert_model_parallel_size) != (1, 1, 1, 1):
        return ["parallelism sizes other than 1 need the megatron backend; set parallelism=single or train.backend=megatron"]
    return []


def max_lost_lr(dtype: str, weight_scale: float) -> Optional[float]:
    """The train.lr below which an AdamW step (~lr per element) is under half a `dtype` step for the median
    weight of N(0, weight_scale), so that weight keeps its value; None for float32/float64 (2^-24: no issue at
    learning rates in use). The bf16 step of |w| in [2^e, 2^(e+1)) is 2^(e-7); half of it is at least |w| 2^-9."""
    bits = MANTISSA_BITS.get(dtype)
    if bits is None:
        return None
    return MEDIAN_ABS_NORMAL * weight_scale * 2.0 ** -(bits + 1)


def half_precision_notes(m: ModelConfig, t: TrainConfig) -> list[str]:
    """A warning when train.lr is too small for the weights' own dtype to take its steps."""
    bound = max_lost_lr(m.dtype, m.init_std)
    if bound is None or t.lr >= bound:
        return []
    return [f"warning: train.backend=torch updates the weights in model.dtype={m.dtype} itself (no fp32 copy): an "
            f"AdamW step of about train.lr={t.lr:g} per element is below half a {m.dtype} step of any weight larger "
            f"than {t.lr * 2 ** MANTISSA_BITS[m.dtype]:.1e}, so it rounds away for most of them (the median |w| of a "
            f"std-{m.init_std:g} init is {MEDIAN_ABS_NORMAL * m.init_std:.1e}: needs train.lr >= {bound:.1e}) and the "
            "model barely trains; set model.dtype=float32 (fp32 weights in the trainer and the engine) or "
            "train.backend=megatron (fp32 main params)"]
