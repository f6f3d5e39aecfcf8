"""Data-parallel torch training: one rank per process, gradients all-reduced before each optimizer step.

Every rank holds the full model and trains on its slice of each optimizer step's samples. Each step's
aggregation denominators (samples or tokens, `algorithms.losses.step_denominator`) are summed over
the ranks before the backward pass, so a rank's loss is its share of the whole step's loss and the
SUM all-reduce of the gradients is exactly the gradient one rank would compute on the whole step (to
float summation order: rescaling each rank's gradient afterwards would not be exact, because the
model's float32 norms round a gradient of a different scale differently). Clipping and AdamW then run
on identical gradients, so ranks stay identical without broadcasting weights. The step's metrics are
partial sums on each rank (train_group.merge_metrics adds them up).

Left out: sharded optimizer state, bucketed overlap of communication with backward, and the critic
(that is what the megatron backend is for); the tiny model's gradients fit one flat buffer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from slime_hydra.training.torch_backend import TorchTrainBackend


def init_process_group(rank: int, world_size: int, init_method: str, device: torch.device) -> None:
    """gloo on CPU, NCCL on GPU."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method, rank=rank,
                                world_size=world_size)


def all_reduce_sum(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item()


def all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """grad <- sum over ranks of grad_r, in one flat buffer (one collective)."""
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


class DataParallelTorchBackend(TorchTrainBackend):
    """TorchTrainBackend whose optimizer steps see the gradient of the step's samples on all ranks."""

    def _step_denominator(self, masks: list[torch.Tensor], mode: str) -> float:
        return all_reduce_sum(super()._step_denominator(masks, mode), self.device)

    def _clip_and_step(self) -> float:
        all_reduce_gradients(self.params)
        return super()._clip_and_step()
