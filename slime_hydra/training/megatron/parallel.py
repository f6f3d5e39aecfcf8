"""torch.distributed + megatron parallel state from the parallelism group.

When the process was started without a process group (the single-process engine, a test), a
one-rank group is created on a free loopback port. Under torchrun / Ray the caller's group is used.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel

from slime_hydra.config.schema import ParallelismConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
                                 # megatron types it int, but only builds timedelta(minutes=...) from it: a fraction
                                 # keeps the key's seconds (rounding made cluster.distributed_timeout_s=3 wait 60 s)
                                 distributed_timeout_minutes=timeout_s / 60)  # type: ignore[arg-type]
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
