"""What a trainer's GPU holds, read from torch and the device: the `perf/` memory figures a run logs beside the plan.

`perf/train_peak_allocated_gib` (torch.cuda.max_memory_allocated since the previous step's figures, so the forward-only
passes of the advantages, the step itself and the sync before it) is what `slime-hydra plan` calls the trainer's
peak; `perf/train_peak_reserved_gib` adds the caching allocator's slack; `perf/gpu_used_gib` is the whole device
(every process: the engines too) when the step ends. Nothing on CPU: the figures are CUDA's.
"""

from __future__ import annotations

from typing import Optional

import torch

GIB = 2**30


def device_used(device: torch.device) -> Optional[int]:
    """Bytes in use on the device by every process (None off CUDA)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def step_figures(device: torch.device) -> dict[str, float]:
    """The peaks since the last call, and the device's use now; the peaks start again from here."""
    if device.type != "cuda":
        return {}
    out = {"perf/train_peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
           "perf/train_peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
           "perf/gpu_used_gib": device_used(device) / GIB}
    torch.cuda.reset_peak_memory_stats(device)
    return out


def release_figures(device: torch.device, used_before: Optional[int], bytes_moved: int) -> dict[str, float]:
    """After a release: the bytes moved, what the device got back and what torch still holds (allocated)."""
    out = {"perf/offload_gib": bytes_moved / GIB}
    if device.type == "cuda" and used_before is not None:
        out["perf/offload_device_freed_gib"] = (used_before - device_used(device)) / GIB
        out["perf/offload_left_allocated_gib"] = torch.cuda.memory_allocated(device) / GIB
    return out
