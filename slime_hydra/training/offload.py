"""cluster.offload_train: a trainer's tensors wait in host memory while the engines generate, and come back unchanged.

`HostOffload.release(tensors)` copies the storage behind each tensor (each storage once: parameters, their
gradients, megatron's contiguous parameter and gradient buffers and the views into them, optimizer state) into host
memory (pinned when it comes from a GPU) and shrinks the storage to zero bytes, then hands the freed blocks back to
the device (torch.cuda.empty_cache). `resume()` grows each storage back to its size and copies the bytes in. The
tensor objects, their views, their shapes and the optimizer's references to them never change, so nothing that
holds them needs to know (megatron's `main_grad` views, its bucket views, torch's optimizer state); a tensor read
while released fails loudly (its storage has no bytes) instead of reading stale data. Bytes go out and come back
bit for bit, so a run's numbers are the same with offload as without.

Why explicit copies and not torch_memory_saver (SGLang's): its CPU backup needs its allocator hooked into the
process before the trainer allocates anything (LD_PRELOAD for the Ray ranks, and the driver's own process for
cluster.backend=local), and it does nothing on CPU, where these moves run in CI all the same.
Left out: gradients are moved too although every step zeroes them first (simpler to keep exact; a discard would
save one copy each way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch


def module_tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    """A module's parameters, their gradients (megatron's `main_grad` too) and its buffers."""
    for p in module.parameters():
        yield p
        for g in (p.grad, getattr(p, "main_grad", None)):
            if isinstance(g, torch.Tensor):
                yield g
    yield from torch.nn.Module.buffers(module)  # by the class: megatron's DDP has a `buffers` list of its own


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """A torch optimizer's parameters (megatron's fp32 main parameters are its inner optimizer's) and state."""
    for group in optimizer.param_groups:
        yield from group["params"]
    for state in optimizer.state.values():
        yield from (v for v in state.values() if isinstance(v, torch.Tensor))


@dataclass
class Moved:
    storage: torch.UntypedStorage
    host: torch.Tensor  # uint8 [nbytes]


@dataclass
class HostOffload:
    """One trainer's offload; `released` while its tensors are on the host."""

    moved: list[Moved] = field(default_factory=list)
    bytes_moved: int = 0  # of the last release
    releases: int = 0
    resumes: int = 0

    @property
    def released(self) -> bool:
        return bool(self.moved)

    def release(self, tensors: Iterable[torch.Tensor]) -> int:
        """Moves every distinct storage of `tensors` to the host; -> bytes moved. A second release first resumes."""
        if self.released:
            self.resume()
        seen: set[int] = set()
        cuda = False
        for t in tensors:
            storage = t.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen or not storage.resizable():
                continue  # empty, moved already, or not torch's to free (a tensor over a memory-mapped file, on the CPU)
            seen.add(storage.data_ptr())
            cuda |= storage.device.type == "cuda"
            host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=storage.device.type == "cuda")
            host.copy_(_as_bytes(storage), non_blocking=True)
            self.moved.append(Moved(storage, host))
        if cuda:
            torch.cuda.synchronize()  # the copies are done before the device blocks go
        for m in self.moved:
            m.storage.resize_(0)
        if cuda:
            torch.cuda.empty_cache()
        self.bytes_moved = sum(m.host.numel() for m in self.moved)
        self.releases += 1
        return self.bytes_moved

    def resume(self) -> int:
        """Every storage back to its size and bytes; -> bytes moved (0 when nothing was released)."""
        moved, self.moved = self.moved, []
        for m in moved:
            m.storage.resize_(m.host.numel())
            _as_bytes(m.storage).copy_(m.host, non_blocking=True)
        if any(m.storage.device.type == "cuda" for m in moved):
            torch.cuda.synchronize()  # the host buffers are dropped next
        if moved:
            self.resumes += 1
        return sum(m.host.numel() for m in moved)


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
