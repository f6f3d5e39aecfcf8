"""Where one training step's GPU time goes: torch.profiler over one call, kernel time by op class and the idle gaps.

Used by `bench_megatron --profile` (GPU). The classes come from kernel names: cuBLAS / CUTLASS GEMMs,
attention (flash / cuDNN / memory-efficient SDPA kernels), Triton kernels (torch.compile's fusions),
optimizer (foreach / fused multi-tensor kernels), NCCL, copies and fills, and torch's eager elementwise
and reduction kernels. GPU idle = the step's wall time minus the union of kernel intervals: time in
which the CPU (Python, launches, synchronisation) holds the GPU up. `top_ops` are the aten ops with the
most device time (input shapes grouped), which say which eager op on which tensor a class's time is.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict

import torch

CLASSES = [  # first match wins, on the lowercased kernel name
    ("attention", ("flash", "fmha", "attention", "cudnn", "sdpa", "mem_eff")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("triton", ("triton",)),
    ("nccl", ("nccl",)),
    ("reduce", ("reduce",)),
    ("elementwise", ("elementwise", "vectorized", "copy", "fill", "index", "gather", "scatter", "cat")),
]


def kernel_class(name: str) -> str:
    low = name.lower()
    for cls, keys in CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


def _union(intervals: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """Total covered length and the gaps between covered stretches (microseconds)."""
    busy, gaps, end = 0.0, [], None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                gaps.append(s - end)
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy, gaps


def profile(fn, label: str, out_dir: str | None = None, top: int = 25) -> dict:
    """Run fn() once under the profiler (after the caller's warm-up); returns and prints the summary."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    path = os.path.join(out_dir or tempfile.mkdtemp(), f"trace_{label}.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    if out_dir is None:
        os.remove(path)
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_class: dict[str, float] = defaultdict(float)
    by_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        cls = "copy/memset" if e["cat"] != "kernel" else kernel_class(e["name"])
        by_class[cls] += e["dur"]
        by_name[e["name"][:90]][0] += e["dur"]
        by_name[e["name"][:90]][1] += 1
    busy, gaps = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
    span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) if kernels else 0.0
    ops = sorted(prof.key_averages(group_by_input_shape=True), key=lambda a: a.self_device_time_total, reverse=True)
    summary = dict(
        label=label, wall_ms=round(wall_us / 1e3, 2), kernel_span_ms=round(span / 1e3, 2), gpu_busy_ms=round(busy / 1e3, 2),
        gpu_idle_ms=round((wall_us - busy) / 1e3, 2), gaps_over_50us=dict(n=sum(g > 50 for g in gaps),
                                                                          ms=round(sum(g for g in gaps if g > 50) / 1e3, 2)),
        kernel_ms_by_class={k: round(v / 1e3, 2) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        top_kernels=[(n, round(t / 1e3, 2), c) for n, (t, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]],
        top_ops=[(a.key, str(a.input_shapes)[:120], round(a.self_device_time_total / 1e3, 2), a.count) for a in ops[:top]],
    )
    print("profile:", json.dumps(summary, indent=1), flush=True)
    return summary
