"""Padding left by token-budget micro-batches on a realistic RL length mix (no model: counts only).

Lengths: prompt uniform in 64-512 tokens + response log-normal (median 700, sigma 1) capped at 8192; 200
ranks' batches of 64 samples. Compares train.use_dynamic_batch_size with train.max_tokens_per_gpu=16384
(padded cost, training/microbatch.py) against fixed micro_batch_size 1/2/4: micro-batches per rank, real /
padded tokens, and the largest micro-batch in padded tokens (a proxy for peak activation memory).
Run: python -m benchmarks.bench_microbatch
"""

from __future__ import annotations

import math
import random

from slime_hydra.training.microbatch import micro_batch_cost, partition_by_tokens


def main() -> None:
    rng = random.Random(1)
    real = pad_dyn = n_dyn = 0
    pad_fix = {1: 0, 2: 0, 4: 0}  # micro_batch_size -> padded tokens
    peak_fix = {1: 0, 2: 0, 4: 0}
    peak_dyn = 0
    for _ in range(200):
        L = [rng.randint(64, 512) + min(8192, int(rng.lognormvariate(math.log(700), 1.0))) for _ in range(64)]
        real += sum(L)
        g = partition_by_tokens(L, 16384, padded=True)
        n_dyn += len(g)
        costs = [micro_batch_cost([L[i] for i in x], True) for x in g]
        pad_dyn += sum(costs)
        peak_dyn = max(peak_dyn, max(costs))
        for m in pad_fix:
            c = [micro_batch_cost(L[s:s + m], True) for s in range(0, 64, m)]
            pad_fix[m] += sum(c)
            peak_fix[m] = max(peak_fix[m], max(c))
    print(f"dynamic 16384: {n_dyn/200:.1f} micro-batches/rank, real/padded {real/pad_dyn:.3f}, peak {peak_dyn}")
    for m in pad_fix:
        print(f"fixed micro_batch_size={m}: {64/m:.0f} micro-batches, real/padded {real/pad_fix[m]:.3f}, peak {peak_fix[m]}")


if __name__ == "__main__":
    main()
