"""Test-only shim: megatron-core on CPU.

megatron-core hard-codes CUDA (tensors made with device="cuda" or torch.cuda.current_device(),
CUDA streams and events, the CUDA RNG state behind tensor_parallel's RNG tracker, memory
queries). `install()` maps all of that to the CPU: a TorchFunctionMode rewrites any cuda device
argument to cpu, and the torch.cuda entry points megatron calls get CPU stand-ins. It is a tests
concern only: production code never imports it, and on a GPU it is never installed.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

_installed = False


def _cpu(dev):
    if isinstance(dev, int) or (isinstance(dev, str) and dev.startswith("cuda")) or (
            isinstance(dev, torch.device) and dev.type == "cuda"):
        return torch.device("cpu")
    return dev


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if func in (torch.Tensor.cuda,):
            return args[0]
        if func is torch.Tensor.to:
            args = tuple(_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
        kwargs.pop("non_blocking", None) if func is torch.Tensor.cuda else None
        return func(*args, **kwargs)


class _Stream:
    def __init__(self, *a, **k): ...
    def wait_stream(self, *a): ...
    def synchronize(self): ...
    def record_event(self, *a): return _Event()
    def __enter__(self): return self
    def __exit__(self, *a): ...


class _Event:
    def __init__(self, *a, **k): ...
    def record(self, *a): ...
    def wait(self, *a): ...
    def synchronize(self): ...
    def query(self): return True
    def elapsed_time(self, other): return 0.0


def install() -> None:
    """Idempotent; call before building any megatron module."""
    global _installed
    if _installed:
        return
    _installed = True
    import sys

    sys.modules.setdefault("flash_mla", None)  # sglang's CUDA-only wheel: raises OSError, not ImportError, on CPU
    # flashinfer holds CUDA kernels only, and megatron imports it where present (its fused rope, unused on CPU): with
    # tvm_ffi, the cutlass DSL and ml_dtypes beneath it, about 1.9 of the 7.4 CPU-seconds a rank spends importing. Absent, as on a
    # CPU-only install: megatron and SGLang both import it inside try/except ImportError.
    sys.modules.setdefault("flashinfer", None)
    c = torch.cuda
    c.current_device = lambda: torch.device("cpu")  # in backward passes too, where the mode below is not active
    c.device_count = lambda: 1
    c.set_device = lambda *a: None
    c.synchronize = lambda *a: None
    c.is_available = lambda: False
    c.Stream, c.Event = _Stream, _Event
    c.current_stream = c.default_stream = lambda *a: _Stream()
    c.stream = lambda s=None: contextlib.nullcontext()
    c.get_rng_state = lambda *a, **k: torch.get_rng_state()
    c.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    c.manual_seed = c.manual_seed_all = lambda seed: None
    c.memory_allocated = c.max_memory_allocated = c.memory_reserved = c.max_memory_reserved = lambda *a: 0
    c.empty_cache = lambda: None
    c.reset_peak_memory_stats = lambda *a: None
    c.mem_get_info = lambda *a: (1 << 34, 1 << 34)
    c.nvtx.range_push = c.nvtx.range_pop = lambda *a, **k: None
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    torch.Tensor.record_stream = lambda self, *a: None
    _type = torch.Tensor.type  # megatron asserts grads are 'torch.cuda.FloatTensor'
    torch.Tensor.type = lambda self, *a, **k: _type(self, *a, **k) if a or k else _type(self).replace("torch.cuda.", "torch.").replace("torch.", "torch.cuda.", 1)
    from megatron.core.tensor_parallel import random as mrandom  # the RNG tracker's CUDA state is the CPU one

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    def to_cpu(tensor, as_numpy=False, record_stream=False):  # the CPU tensor as numpy too: all_to_all's split sizes
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    moe_utils.maybe_move_tensor_to_cpu = token_dispatcher.maybe_move_tensor_to_cpu = to_cpu
    _uneven_collectives()
    _CudaToCpu().__enter__()  # stays active for the process


def _uneven_collectives() -> None:
    """gloo's all_gather and reduce_scatter take equal sizes only; megatron's alltoall dispatcher with TP and sequence
    parallelism gathers and scatters each TP rank's routed tokens, uneven counts (NCCL takes them). The same results
    from collectives gloo has: padded to the largest and cut back, and a full all_reduce cut to this rank's part."""
    import torch.distributed as dist

    all_gather, reduce_scatter = dist.all_gather, dist.reduce_scatter

    def uneven_all_gather(tensor_list, tensor, group=None, async_op=False):
        sizes = [t.shape[0] for t in tensor_list]
        if len(set(sizes)) == 1 and tensor.shape[0] == sizes[0]:
            return all_gather(tensor_list, tensor, group=group, async_op=async_op)
        most = max(sizes)
        padded = [tensor.new_empty(most, *tensor.shape[1:]) for _ in sizes]
        mine = torch.cat([tensor, tensor.new_zeros(most - tensor.shape[0], *tensor.shape[1:])])
        all_gather(padded, mine, group=group)
        for out, p, n in zip(tensor_list, padded, sizes):
            out.copy_(p[:n])

    def uneven_reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if len({t.shape for t in input_list}) == 1:
            return reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
        full = torch.cat(input_list)
        dist.all_reduce(full, op=op, group=group)
        output.copy_(full.split([t.shape[0] for t in input_list])[dist.get_rank(group)])

    dist.all_gather, dist.reduce_scatter = uneven_all_gather, uneven_reduce_scatter
