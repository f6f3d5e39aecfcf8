"""Data-parallel torch training: one rank per process, gradients all-reduced before each optimizer step.

Every rank holds the full model and trains on its slice of each optimizer step's samples. Each step's
aggregation denominators (samples or tokens, `algorithms.losses.step_denominator`) are summed over
the ranks before the backward pass, so a rank's loss is its share of the whole step's loss and the
SUM all-reduce of the gradients is exactly the gradient one rank would compute on the whole step (to
float summation order: rescaling each rank's gradient afterwards would not be exact, because the
model's float32 norms round a gradient of a different scale differently). Clipping and AdamW then run
on identical gradients, so ranks stay identical without broadcasting weights. The step's metrics are
partial sums on each rank (train_group.merge_metrics adds them up).

Deadlines: the group is created with `cluster.distributed_timeout_s`, which bounds the rendezvous and each
collective. On gloo (CPU) a collective past it raises; the rank turns that into a RunError naming the collective,
the rank and the key, which reaches the driver as that message. On NCCL the timeout is enforced by torch's
watchdog thread, as torch's TORCH_NCCL_ASYNC_ERROR_HANDLING says (default 3, SkipCleanUp: the rank's process is
torn down), so the driver sees the rank die and names it; set to 0, nothing fires and the driver's
`cluster.ray_call_timeout_s` is the deadline.

The trainer takes these collectives as an object (`DataParallel`, a training/collectives.Collectives), and hands
them to PPO's critic (training/critic.py), which steps the same way: its value-loss denominators are summed over the
ranks and its gradients all-reduced before its clip and step.

Left out: sharded optimizer state and bucketed overlap of communication with backward (that is what the
megatron backend is for); the tiny model's gradients fit one flat buffer.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Iterator

import torch
import torch.distributed as dist

from slime_hydra.errors import RunError

KEY = "cluster.distributed_timeout_s"
_timeout_s = [float(dist.default_pg_timeout.total_seconds())]  # this process's group's, once init_process_group set it


def init_process_group(rank: int, world_size: int, init_method: str, device: torch.device, timeout_s: float) -> None:
    """gloo on CPU, NCCL on GPU; rendezvous and every collective bounded by `timeout_s`."""
    if not dist.is_initialized():
        with collective(f"creating the process group ({init_method}, {world_size} ranks)", rank, timeout_s):
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method, rank=rank,
                                    world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
        _timeout_s[0] = timeout_s


def _failed(e: RuntimeError, what: str, rank: int | None, timeout_s: float | None) -> RunError:
    """A failed rendezvous or collective (timed out, or a peer gone) as a RunError naming it, the rank and the key."""
    r = dist.get_rank() if rank is None else rank
    t = _timeout_s[0] if timeout_s is None else timeout_s
    first = (str(e).strip().splitlines() or [repr(e)])[0][:300]
    why = (f"did not complete within {KEY}={t:g} s ({first}): another rank is stuck or gone; raise {KEY} if it is "
           "only slow" if "timed out" in str(e).lower() else f"failed: {first}")
    return RunError(f"{what} on rank {r} {why}.")


@contextlib.contextmanager
def collective(what: str, rank: int | None = None, timeout_s: float | None = None) -> Iterator[None]:
    """Around a collective alone: any RuntimeError of it (torch.distributed's errors are RuntimeErrors) is its failure."""
    try:
        yield
    except RuntimeError as e:
        raise _failed(e, what, rank, timeout_s) from e


@contextlib.contextmanager
def collective_failures(what: str, rank: int) -> Iterator[None]:
    """Around code that runs collectives among other work (megatron's steps): a collective that timed out or lost a
    peer becomes collective()'s RunError naming `what`, the rank and the key; any other error passes unchanged."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, dist.DistError) or "timed out" in str(e).lower():
            raise _failed(e, what, rank, None) from e
        raise


def all_reduce_sum(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    with collective("all-reduce of the step's loss denominator"):
        dist.all_reduce(t)
    return t.item()


def all_reduce_gradients(params: list[torch.nn.Parameter]) -> None:
    """grad <- sum over ranks of grad_r, in one flat buffer (one collective)."""
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    with collective("all-reduce of the gradients"):
        dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


class DataParallel:
    """training/collectives.Collectives of this process's data-parallel group: every sum and gradient all-reduced."""

    def __init__(self, device: torch.device):
        self.device = device

    def sum(self, value: float) -> float:
        return all_reduce_sum(value, self.device)

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        all_reduce_gradients(params)
