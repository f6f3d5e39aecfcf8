"""torch.distributed + megatron parallel state from the parallelism group.

When the process was started without a process group (the single-process engine, a test), a
one-rank group is created on a free loopback port. Under torchrun / Ray the caller's group is used.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel

from slime_hydra import ports
from slime_hydra.config.schema import ParallelismConfig

# megatron's rank order (initialize_model_parallel's default, passed explicitly so the plan reads the same one): TP
# varies fastest, then CP, EP, DP, and PP slowest, so a TP group is consecutive ranks (one node's NVLink)
ORDER = "tp-cp-ep-dp-pp"


def rank_groups(p: ParallelismConfig, world_size: int) -> dict[str, list[list[int]]]:
    """{"tp"|"cp"|"dp"|"pp"|"ep"|"etp": the rank groups} that initialize_model_parallel builds for `p` on `world_size`
    ranks (megatron's own RankGenerators, no process group): what `slime-hydra plan` prints (app/plan.py). The experts'
    grid is megatron's second one: expert-TP × EP × expert-DP × PP over the same ranks (EP taken out of data parallel)."""
    tp, pp, cp, ep = (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
                      p.expert_model_parallel_size)
    etp = expert_tensor_parallel_size(p)
    gen = ps.RankGenerator(tp=tp, ep=1, dp=world_size // (tp * pp * cp), pp=pp, cp=cp, order=ORDER)
    groups = {kind: gen.get_ranks(kind) for kind in ("tp", "cp", "dp", "pp")}
    if ep > 1:
        expert = ps.RankGenerator(tp=etp, ep=ep, dp=world_size // (etp * ep * pp), pp=pp, cp=1, order=ORDER,
                                  rank_offset=0)
        groups |= {"ep": expert.get_ranks("ep"), "etp": expert.get_ranks("tp")}
    return groups


def expert_tensor_parallel_size(p: ParallelismConfig) -> int:
    """parallelism.expert_tensor_parallel_size, None meaning megatron's default: the tensor-parallel size."""
    return p.expert_tensor_parallel_size or p.tensor_model_parallel_size


def _free_port() -> int:
    return ports.free_port()


def init_parallel(p: ParallelismConfig, seed: int, backend: str, timeout_s: float = 1800.0) -> None:
    """Idempotent: (re)initialises megatron's model-parallel groups for `p` on the current world. timeout_s
    (cluster.distributed_timeout_s) bounds the rendezvous and every collective of the groups created here."""
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group(backend, rank=int(os.environ.get("RANK", 0)), world_size=int(os.environ.get("WORLD_SIZE", 1)),
                                timeout=datetime.timedelta(seconds=timeout_s))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=p.tensor_model_parallel_size,
                                 pipeline_model_parallel_size=p.pipeline_model_parallel_size,
                                 context_parallel_size=p.context_parallel_size,
                                 expert_model_parallel_size=p.expert_model_parallel_size,
                                 expert_tensor_parallel_size=expert_tensor_parallel_size(p), order=ORDER,
                                 # megatron types it int, but only builds timedelta(minutes=...) from it: a fraction
                                 # keeps the key's seconds (rounding made cluster.distributed_timeout_s=3 wait 60 s)
                                 distributed_timeout_minutes=timeout_s / 60)  # type: ignore[arg-type]
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
