"""`make bench-megatron` (GPU): train throughput, MFU and peak memory of the megatron backend vs the torch backend.

Shapes: model=qwen3_0_6b and model=qwen3_4b, random init, bf16, sequences of 2048 tokens, one GPU.
Each row is one RL optimizer step (train_rollout: forward, GRPO loss, backward, optimizer) over
`global_batch` full-length sequences in micro-batches of `mbs`, timed over `iters` steps after
`warmup` steps. MFU = tokens/s × FLOPs/token / 790e12 (the H200's measured bf16 matmul rate), with
FLOPs/token = 6 N + 6 L s d_attn (N: matmul parameters, the output projection included and the
embedding lookup not; the causal-attention term is half of the 12 L s d_attn of full attention).

`--variants all` (or indices into VARIANTS) measures the 4B shape under megatron knobs in one command:
torch.compile of each transformer layer, SDPA's native GQA, bf16 gradient buffers, selective (MLP) or
partial full recompute, larger micro-batches, larger log-prob chunks; the torch backend's row is the
baseline. Measured on one H200 (2026-12-01, `python3 -m benchmarks.bench_megatron --variants 2,3,1,0,4
--warmup 1 --iters 2`): torch mb4 full recompute 9,951 tok/s 32.7% MFU 52.6 GiB; megatron mb2 10,234 tok/s
33.6% 103.2 GiB; + native GQA + bf16 grads 10,533 tok/s 34.6% 95.4 GiB; + compile_layers 14,152 tok/s 46.5%
90.2 GiB (44.8%, 13,647 tok/s with `--variants 3,6 --warmup 2 --iters 4`); mb4 selective MLP recompute +
compile 12,453 tok/s 40.9%; mb4 full recompute of 18 of 36 layers (block) + compile 13,211 tok/s 43.4%.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch

PEAK = 790e12


def flops_per_token(m, seq: int, vocab: int) -> float:
    d_attn = m.num_attention_heads * m.kv_channels
    kv = m.num_query_groups * m.kv_channels
    per_layer = m.hidden_size * (d_attn + 2 * kv) + d_attn * m.hidden_size + 3 * m.hidden_size * m.ffn_hidden_size
    n = m.num_layers * per_layer + vocab * m.hidden_size  # + the output projection
    return 6 * n + 6 * m.num_layers * seq * d_attn


def batch(n: int, seq: int, vocab: int):
    from slime_hydra.training.base import TrainBatch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (n, seq + 1), generator=g)
    mask = torch.ones(n, seq)
    adv = torch.randn(n, 1, generator=g).expand(n, seq).contiguous()
    return TrainBatch(ids, torch.ones_like(ids), mask, adv)


def measure(trainer, b, warmup: int, iters: int) -> tuple[float, float]:
    for _ in range(warmup):
        trainer.train_rollout(b)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        trainer.train_rollout(b)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters, torch.cuda.max_memory_allocated() / 2**30


def run(backend: str, option: str, seq: int, mbs: int, gbs: int, warmup: int, iters: int, recompute: str | None,
        knobs: dict | None = None) -> dict:
    """knobs (megatron only): recompute_method / recompute_num_layers (with recompute=full), recompute_modules
    (with recompute=selective), compile_layers, grad_reduce_in_fp32, native_gqa, chunk_elements."""
    from types import SimpleNamespace

    from slime_hydra.config.preflight import compose_run

    knobs = dict(knobs or {})
    over = [f"model={option}", f"train={backend}", "train.lr=1e-6", "rollout.rollout_batch_size=1",
            f"rollout.n_samples_per_prompt={gbs}", f"train.micro_batch_size={mbs}", "train.skip_zero_advantage_samples=false",
            f"model.max_position_embeddings={max(seq + 1, 4096)}", "num_rollout=1"]
    if recompute and backend == "megatron":
        over += [f"parallelism.recompute_granularity={recompute}"]
        if recompute == "full":
            over += [f"parallelism.recompute_method={knobs.get('recompute_method', 'uniform')}",
                     f"parallelism.recompute_num_layers={knobs.get('recompute_num_layers', 1)}"]
    cfg = compose_run(over)
    m, vocab, dev = cfg.model, cfg.model.vocab_size, torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    if backend == "megatron":
        from slime_hydra.training.megatron import logprobs, model as mg_model
        from slime_hydra.training.megatron.backend import MegatronTrainBackend

        mg_model.SDPAttention.native_gqa = knobs.get("native_gqa", False)
        logprobs.CHUNK_ELEMENTS = knobs.get("chunk_elements", 1 << 27)
        overrides = {"recompute_modules": knobs["recompute_modules"]} if "recompute_modules" in knobs else None
        trainer = MegatronTrainBackend(None, SimpleNamespace(vocab_size=vocab), m, cfg.parallelism, cfg.algorithm, cfg.train,
                                       1.0, 100, dev, seed=cfg.seed, config_overrides=overrides,
                                       grad_reduce_in_fp32=knobs.get("grad_reduce_in_fp32", True),
                                       compile_layers=knobs.get("compile_layers", False))
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        from slime_hydra.models.build import hf_config_kwargs
        from slime_hydra.training.torch_backend import TorchTrainBackend

        hc = AutoConfig.for_model(m.architecture, **hf_config_kwargs(m, vocab, 0, 1))
        hc._attn_implementation = "sdpa"
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(hc, dtype=torch.bfloat16)
        if recompute:
            model.gradient_checkpointing_enable()
        trainer = TorchTrainBackend(model, cfg.algorithm, cfg.train, 1.0, 100, dev)
    step_s, peak = measure(trainer, batch(gbs, seq, vocab), warmup, iters)
    tps = gbs * seq / step_s
    row = dict(backend=backend, model=option, seq=seq, micro_batch=mbs, global_batch=gbs, recompute=recompute or "none",
               knobs=knobs, step_s=round(step_s, 3), tokens_per_s=round(tps), mfu=round(tps * flops_per_token(m, seq, vocab) / PEAK, 4),
               peak_mem_gib=round(peak, 1))
    del trainer
    gc.collect()
    return row


ROWS = [  # (backend, model option, micro-batch, global batch, recompute)
    ("torch", "qwen3_0_6b", 8, 16, None), ("megatron", "qwen3_0_6b", 8, 16, None),
    ("torch", "qwen3_4b", 4, 8, "full"), ("megatron", "qwen3_4b", 2, 8, None), ("megatron", "qwen3_4b", 4, 8, "full"),
]


# --variants: the 4B shape, one torch baseline and megatron variants, each alone in the list below
# (backend, micro-batch, recompute, knobs); a variant that fails (OOM, compile error) prints its error and the rest go on
VARIANTS = [
    ("torch", 4, "full", {}),
    ("megatron", 2, None, {}),
    ("megatron", 2, None, {"native_gqa": True, "grad_reduce_in_fp32": False}),
    ("megatron", 2, None, {"native_gqa": True, "grad_reduce_in_fp32": False, "compile_layers": True}),
    ("megatron", 4, "selective", {"native_gqa": True, "grad_reduce_in_fp32": False, "compile_layers": True,
                                  "recompute_modules": ["mlp"]}),
    ("megatron", 4, "selective", {"native_gqa": True, "grad_reduce_in_fp32": False, "recompute_modules": ["core_attn", "mlp"]}),
    ("megatron", 4, "full", {"native_gqa": True, "grad_reduce_in_fp32": False, "compile_layers": True,
                             "recompute_method": "block", "recompute_num_layers": 18}),
    ("megatron", 8, "full", {"native_gqa": True, "grad_reduce_in_fp32": False, "compile_layers": True,
                             "recompute_method": "uniform", "recompute_num_layers": 1, "chunk_elements": 1 << 29}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--only", default="", help="comma-separated backend:model filters, e.g. megatron:qwen3_4b")
    ap.add_argument("--out", default="bench_out/bench_megatron.json")
    ap.add_argument("--variants", default="", help="comma-separated indices into VARIANTS (4B shape, global batch 8), "
                    "or 'all'; replaces the default rows")
    args = ap.parse_args()
    from slime_hydra.config.store import register

    register()
    keep = set(filter(None, args.only.split(",")))
    if args.variants:
        picked = range(len(VARIANTS)) if args.variants == "all" else [int(i) for i in args.variants.split(",")]
        jobs = [(VARIANTS[i][0], "qwen3_4b", VARIANTS[i][1], 8, VARIANTS[i][2], VARIANTS[i][3]) for i in picked]
    else:
        jobs = [(b, o, mbs, gbs, rc, {}) for b, o, mbs, gbs, rc in ROWS if not keep or f"{b}:{o}" in keep]
    rows = []
    for backend, option, mbs, gbs, rc, knobs in jobs:
        try:
            row = run(backend, option, args.seq, mbs, gbs, args.warmup, args.iters, rc, knobs)
        except Exception as e:  # OOM, a compile failure: report it and measure the next variant
            row = dict(backend=backend, model=option, micro_batch=mbs, recompute=rc or "none", knobs=knobs,
                       error=f"{type(e).__name__}: {str(e)[:160]}")
        gc.collect()  # after the except block: the exception's frames no longer hold the trainer
        torch.cuda.empty_cache()
        torch._dynamo.reset()
        print(json.dumps(row), flush=True)
        rows.append(row)
    import os

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print("| backend | model | seq×gbs (mbs) | tokens/s | MFU | peak GiB |\n|---|---|---|---|---|---|")
    for r in rows:
        if "error" not in r:
            print(f"| {r['backend']} | {r['model']} | {r['seq']}×{r['global_batch']} ({r['micro_batch']}, recompute "
                  f"{r['recompute']}{', ' + json.dumps(r['knobs']) if r['knobs'] else ''}) | {r['tokens_per_s']} | "
                  f"{r['mfu']:.1%} | {r['peak_mem_gib']} |")


if __name__ == "__main__":
    main()
