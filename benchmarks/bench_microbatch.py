"""Padding left by token-budget micro-batches on a realistic RL length mix, and packed (train.qkv_format=thd) vs
padded training on the CPU.

Lengths: prompt uniform in 64-512 tokens + response log-normal (median 700, sigma 1) capped at 8192; 200
ranks' batches of 64 samples. Compares train.use_dynamic_batch_size with train.max_tokens_per_gpu=16384
(padded cost, training/microbatch.py) against fixed micro_batch_size 1/2/4: micro-batches per rank, real /
padded tokens, and the largest micro-batch in padded tokens (a proxy for peak activation memory).
The packed arm trains (torch backend, transformers' sdpa forward, float32, 1 thread) one step of 32 samples of
the same mix scaled down by --scale (default 1/4: prompts 16-128, responses median 175, capped at 2048) on a
2-layer 128-wide model: real (non-padding) tokens per CPU second of the step (process time, one thread: the VM's
cores are shared, so wall time carries other jobs' load), padded vs packed, fixed micro-batches of 4 and the token
budget (--budget real or padded tokens), each the median of --repeats; the ratio is against the padded
fixed-size step of the same run.
Run: python -m benchmarks.bench_microbatch [--arm counts|packed|both]
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import statistics
import time

import torch

from slime_hydra.app.algorithm import algorithm_specs
from slime_hydra.config.schema import AlgorithmConfig, ModelConfig, TrainConfig
from slime_hydra.models.build import build_model
from slime_hydra.models.tokenizer import build_char_tokenizer
from slime_hydra.training.batch import collate
from slime_hydra.training.microbatch import micro_batch_cost, partition_by_tokens
from slime_hydra.training.torch_backend import TorchTrainBackend
from slime_hydra.types import Sample


def length_mix(rng: random.Random, scale: float = 1.0) -> tuple[int, int]:
    """(prompt, response) tokens of one sample of the realistic mix, lengths times `scale`."""
    prompt = rng.randint(64, 512)
    response = min(8192, int(rng.lognormvariate(math.log(700), 1.0)))
    return max(1, round(prompt * scale)), max(1, round(response * scale))


def counts() -> None:
    rng = random.Random(1)
    real = pad_dyn = n_dyn = 0
    pad_fix = {1: 0, 2: 0, 4: 0}  # micro_batch_size -> padded tokens
    peak_fix = {1: 0, 2: 0, 4: 0}
    peak_dyn = 0
    for _ in range(200):
        L = [sum(length_mix(rng)) for _ in range(64)]
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



def packed_arm(scale: float, n: int, budget: int, repeats: int) -> None:
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    rng = random.Random(2)
    samples = []
    for i in range(n):
        p, r = length_mix(rng, scale)
        ids = [rng.randrange(3, len(tok)) for _ in range(p + r)]
        samples.append(Sample(prompt="", prompt_tokens=ids[:p], tokens=ids, response_length=r, group_index=i, index=i))
    batch = collate(samples, torch.tensor([rng.choice([-1.0, 1.0]) for _ in range(n)]), tok.pad_token_id)
    lengths = batch.attention_mask.sum(-1)
    real = int(lengths.sum())
    model_cfg = ModelConfig(num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4, num_query_groups=2,
                            kv_channels=32, dtype="float32")
    base = build_model(model_cfg, tok, seed=0)
    print(f"packed arm: {n} samples, real tokens {real} (longest {int(lengths.max())}, mean {real / n:.0f}), "
          f"padded to the batch's longest {n * int(lengths.max())}; scale {scale}, budget {budget}, median of {repeats}")
    arms = {"padded mbs=4": dict(qkv_format="bshd", micro_batch_size=4),
            "packed mbs=4": dict(qkv_format="thd", micro_batch_size=4),
            f"padded budget {budget}": dict(qkv_format="bshd", use_dynamic_batch_size=True, max_tokens_per_gpu=budget),
            f"packed budget {budget}": dict(qkv_format="thd", use_dynamic_batch_size=True, max_tokens_per_gpu=budget)}
    runs = {}
    for name, kw in arms.items():
        train = TrainConfig(global_batch_size=n, num_steps_per_rollout=1, lr=1e-4, prefix_sharing=False, **kw)
        spec = algorithm_specs(AlgorithmConfig(), train, total_steps=10)
        b = TorchTrainBackend(copy.deepcopy(base), spec.loss, spec.optim, spec.batch, 1.0, torch.device("cpu"))
        mbs = b._micro_batches(batch, torch.arange(n))
        cost = sum(micro_batch_cost(lengths[g].tolist(), kw["qkv_format"] == "bshd") for g in mbs)
        runs[name] = (b, len(mbs), cost, [], [])
    for _ in range(repeats):  # round robin: a change in the VM's load reaches every arm alike
        for b, _, _, walls, cpus in runs.values():
            t0, c0 = time.perf_counter(), time.process_time()
            b.train_rollout(batch)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    base_rate = None
    for name, (_, k, cost, walls, cpus) in runs.items():
        rate = real / statistics.median(cpus)
        base_rate = base_rate or rate
        print(f"  {name:<22} {k:>3} micro-batches, tokens run {cost:>6} (real/run {real / cost:.3f}), step "
              f"{statistics.median(cpus):5.2f} CPU s ({statistics.median(walls):5.2f} s wall), real tokens per CPU s "
              f"{rate:6.0f}, x{rate / base_rate:.2f} vs padded mbs=4")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", choices=["counts", "packed", "both"], default="both")
    ap.add_argument("--scale", type=float, default=1 / 4)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.arm in ("counts", "both"):
        counts()
    if args.arm in ("packed", "both"):
        packed_arm(args.scale, args.samples, args.budget, args.repeats)


if __name__ == "__main__":
    main()
