"""`make bench-megatron` (GPU): train throughput, MFU and peak memory of the megatron backend vs the torch backend.

Shapes: model=qwen3_0_6b and model=qwen3_4b, random init, bf16, sequences of 2048 tokens, one GPU.
Each row is one RL optimizer step (train_rollout: forward, GRPO loss, backward, optimizer) over
`global_batch` full-length sequences in micro-batches of `mbs`, composed and validated like a run
(`compose_run` with the row's overrides: the megatron settings are config keys, train.megatron.* and
parallelism.recompute_*). Each step is timed alone (CUDA synchronised) after `warmup` steps; a row
reports the median step and its min/max over `iters`, and tokens/s and MFU from the median.
MFU = tokens/s × FLOPs/token / 790e12 (the H200's measured bf16 matmul rate), with FLOPs/token =
6 N + 6 L s d_attn (N: matmul parameters, the output projection included and the embedding lookup
not; the causal-attention term is half of the 12 L s d_attn of full attention).

Parity of torch.compile: every megatron row records the log-probs of the batch before its first step
and that step's loss and grad norm; two rows that differ only in one train.megatron.compile_* key start
from the same initialisation (same seed; checked by a weight checksum) and are compared at the end
(max |Δ log-prob|, relative Δ grad norm). A row with compile_log_probs also reports the same model's log-probs
through the eager kernels (lp0_vs_eager_kernels_max_abs): the kernels' own difference, without the
run-to-run difference of two compiled models. `--profile`: benchmarks/profile_step.py on one more step.

`--mix` runs instead the rows on a realistic RL length mix, padded vs packed vs packed + token budget
(benchmarks/bench_megatron_mix.py, which states the distribution; `--mix-models`, `--mix-variants`; `--tiny`: on CPU).
`--variants` adds 4B megatron variants (indices into VARIANTS, or 'all') to the default rows.
The figures measured on the H200 are in docs/gpu_results.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import time

import torch

from benchmarks.megatron_settings import BEST, PEAK, V1, flops_per_token

EAGER = ("train.megatron.grad_reduce_in_fp32=false",)

ROWS = [  # (backend, model option, micro-batch, global batch, overrides); torch's "recompute": HF gradient checkpointing
    ("torch", "qwen3_0_6b", 8, 16, ()),
    ("megatron", "qwen3_0_6b", 8, 16, BEST),
    ("torch", "qwen3_4b", 4, 8, ("recompute",)),
    ("megatron", "qwen3_4b", 4, 8, BEST),  # micro-batch 4 without recompute: 98 GiB (before the fused kernels: 2, V1)
]
VARIANTS = [  # megatron, qwen3_4b, global batch --global-batch-4b: (micro-batch, overrides)
    (2, EAGER),  # the compile parity partner of the 4B default row
    (2, V1 + ("train.megatron.log_probs_chunk_size=4096",)),
    (4, V1 + ("parallelism.recompute_granularity=selective", "parallelism.recompute_modules=[mlp]")),
    (4, V1 + ("parallelism.recompute_granularity=full", "parallelism.recompute_method=block",
                "parallelism.recompute_num_layers=18")),
    (2, ("train.megatron.compile_layers=true",)),  # compile with fp32 gradient buffers (the schema's default)
    (2, V1 + ("train.megatron.compile_log_probs=true",)),  # 5
    (2, BEST),  # 6
    (4, BEST),  # 7: no recompute (now the default 4B row)
    (2, V1),  # 8: the earlier default 4B row (V1 alone); the compile parity partner of 5
]


def batch(n: int, seq: int, vocab: int):
    from slime_hydra.protocols import TrainBatch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (n, seq + 1), generator=g)
    mask = torch.ones(n, seq)
    adv = torch.randn(n, 1, generator=g).expand(n, seq).contiguous()
    return TrainBatch(ids, torch.ones_like(ids), mask, adv)


def measure(trainer, b, warmup: int, iters: int) -> tuple[list[float], dict]:
    """Per-step seconds of `iters` steps after `warmup`; the first step's metrics."""
    first = trainer.train_rollout(b)
    for _ in range(warmup - 1):
        trainer.train_rollout(b)
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        trainer.train_rollout(b)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, first


def compose(backend: str, option: str, seq: int, mbs: int, gbs: int, overrides) -> object:
    from slime_hydra.app.preflight import compose_run

    return compose_run([f"model={option}", f"train={backend}", "train.lr=1e-6", "train.min_lr=0", "rollout.rollout_batch_size=1",
                        f"rollout.n_samples_per_prompt={gbs}", f"train.micro_batch_size={mbs}",
                        "train.skip_zero_advantage_samples=false", f"model.max_position_embeddings={max(seq + 1, 4096)}",
                        "num_rollout=1", "cluster.device=cuda", *[o for o in overrides if "=" in o]])


def trainer_for(backend: str, cfg, recompute: bool):
    from types import SimpleNamespace

    from slime_hydra.app.algorithm import algorithm_specs

    m, dev = cfg.model, torch.device("cuda")
    s = algorithm_specs(cfg.algorithm, cfg.train, total_steps=100)
    if backend == "megatron":
        from slime_hydra.training.megatron.trainer import build_trainer

        return build_trainer(None, SimpleNamespace(vocab_size=m.vocab_size), m, cfg.parallelism, cfg.train.megatron, s, 1.0,
                             dev, seed=cfg.seed)
    from transformers import AutoConfig, AutoModelForCausalLM

    from slime_hydra.models.build import hf_config_kwargs
    from slime_hydra.training.torch_backend import TorchTrainBackend

    hc = AutoConfig.for_model(m.architecture, **hf_config_kwargs(m, m.vocab_size, 0, 1))
    hc._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(hc, dtype=torch.bfloat16)
    if recompute:
        model.gradient_checkpointing_enable()
    return TorchTrainBackend(model, s.loss, s.optim, s.batch, 1.0, dev)


def run(backend: str, option: str, seq: int, mbs: int, gbs: int, warmup: int, iters: int, overrides=(),
        profile_dir: str | None = None) -> dict:
    cfg = compose(backend, option, seq, mbs, gbs, overrides)
    m, vocab = cfg.model, cfg.model.vocab_size
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    trainer = trainer_for(backend, cfg, "recompute" in overrides)
    b = batch(gbs, seq, vocab)
    extra = {}
    if backend == "megatron":  # compile parity: log-probs before any step, a checksum of the initial weights
        extra["lp0"] = trainer.compute_log_probs(b)
        extra["init_sum"] = sum(p.double().sum().item() for p in list(trainer.gpt.parameters())[:4])
        mg = trainer.runner.megatron
        if mg.compile_log_probs:  # the same logits through the eager kernels: the compiled kernels' own difference
            trainer.runner.megatron = dataclasses.replace(mg, compile_log_probs=False)
            extra["lp0_vs_eager_kernels_max_abs"] = float((trainer.compute_log_probs(b) - extra["lp0"]).abs().max())
            trainer.runner.megatron = mg
    times, first = measure(trainer, b, warmup, iters)
    step_s = statistics.median(times)
    if profile_dir is not None:  # one more step under torch.profiler, after the timed ones
        from benchmarks.profile_step import profile

        label = f"{backend}_{option}_mbs{mbs}_" + "_".join(o.split(".")[-1].replace("=", "-") for o in overrides)
        extra["profile"] = profile(lambda t=trainer: t.train_rollout(b), label[:120])
    tps = gbs * seq / step_s
    row = dict(backend=backend, model=option, seq=seq, micro_batch=mbs, global_batch=gbs, overrides=list(overrides),
               step_s=round(step_s, 4), step_min_s=round(min(times), 4), step_max_s=round(max(times), 4), iters=iters,
               tokens_per_s=round(tps), mfu=round(tps * flops_per_token(m, seq, vocab) / PEAK, 4),
               mfu_at_min_max=[round(gbs * seq / t * flops_per_token(m, seq, vocab) / PEAK, 4) for t in (max(times), min(times))],
               peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1),
               first_step={k: first[k] for k in ("train/loss", "train/grad_norm") if k in first}, **extra)
    del trainer
    gc.collect()
    return row


def compile_parity(rows: list[dict]) -> list[dict]:
    """Pairs of rows equal but for one train.megatron.compile_*=true: the same batch's log-probs and first step."""
    out = []
    for r, key in [(r, o) for r in rows if "lp0" in r for o in r["overrides"] if "megatron.compile_" in o and o.endswith("=true")]:
        want = sorted(o for o in r["overrides"] if o != key)
        for e in rows:
            if ("lp0" in e and e["model"] == r["model"] and e["micro_batch"] == r["micro_batch"]
                    and sorted(e["overrides"]) == want):
                ga, gb = e["first_step"]["train/grad_norm"], r["first_step"]["train/grad_norm"]
                out.append(dict(model=r["model"], micro_batch=r["micro_batch"], compiled=key, same_init=e["init_sum"] == r["init_sum"],
                                max_abs_logprob_diff=float((e["lp0"] - r["lp0"]).abs().max()),
                                mean_abs_logprob=float(e["lp0"].abs().mean()),
                                loss_eager=e["first_step"]["train/loss"], loss_compiled=r["first_step"]["train/loss"],
                                grad_norm_rel_diff=abs(ga - gb) / max(abs(ga), 1e-12)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=None, help="default 3 (--mix: 2, the first step included)")
    ap.add_argument("--iters", type=int, default=None, help="default 10 (--mix: 3)")
    ap.add_argument("--only", default="", help="comma-separated backend:model filters of the default rows, e.g. "
                    "megatron:qwen3_4b; 'none' keeps only --variants")
    ap.add_argument("--variants", default="", help="comma-separated indices into VARIANTS (4B, --global-batch-4b) or 'all'")
    ap.add_argument("--global-batch-4b", type=int, default=8, help="sequences per optimizer step of the 4B rows and "
                    "variants (the micro-batch stays; more sequences spread the step's fixed cost: optimizer, grad reduce)")
    ap.add_argument("--out", default=None, help="default bench_out/bench_megatron.json (--mix: bench_megatron_mix.json)")
    ap.add_argument("--profile", action="store_true", help="profile one more step of each row (benchmarks/profile_step.py): "
                    "GPU kernel time by op class, idle gaps, top ops; into the JSON and printed")
    ap.add_argument("--mix", action="store_true", help="the realistic length mix rows (benchmarks/bench_megatron_mix.py)")
    ap.add_argument("--mix-models", default="qwen3_4b,addition,qwen3_0_6b", help="comma-separated keys of "
                    "bench_megatron_mix.MODELS, in order (qwen3_4b, addition, qwen3_0_6b; --tiny: tiny)")
    ap.add_argument("--mix-variants", default="budget,padded,packed", help="comma-separated: budget, padded, packed")
    ap.add_argument("--mix-global-batch", type=int, default=64, help="samples per step of the rl mix (8 per prompt)")
    ap.add_argument("--mix-dynamic-first", action="store_true", help="compile dynamic from the first shape: faster "
                    "warm-up, less faithful graphs (bench_megatron_mix's docstring)")
    ap.add_argument("--tiny", action="store_true", help="with --mix: the tiny model on CPU under the tests' megatron shim")
    args = ap.parse_args()
    if args.mix:
        from benchmarks import bench_megatron_mix

        bench_megatron_mix.main(["tiny"] if args.tiny else args.mix_models.split(","), args.mix_variants.split(","),
                                args.mix_global_batch, 2 if args.warmup is None else args.warmup,
                                3 if args.iters is None else args.iters, args.out or "bench_out/bench_megatron_mix.json",
                                args.tiny, args.mix_dynamic_first)
        return
    args.warmup = 3 if args.warmup is None else args.warmup
    args.iters = 10 if args.iters is None else args.iters
    args.out = args.out or "bench_out/bench_megatron.json"
    from slime_hydra.config.store import register

    register()
    keep = set(filter(None, args.only.split(",")))
    gbs_4b = args.global_batch_4b
    jobs = [(b, o, mbs, gbs_4b if o == "qwen3_4b" else gbs, over) for b, o, mbs, gbs, over in ROWS if not keep or f"{b}:{o}" in keep]
    picked = range(len(VARIANTS)) if args.variants == "all" else [int(i) for i in filter(None, args.variants.split(","))]
    jobs += [("megatron", "qwen3_4b", VARIANTS[i][0], gbs_4b, VARIANTS[i][1]) for i in picked]
    rows = []
    for backend, option, mbs, gbs, over in jobs:
        try:
            row = run(backend, option, args.seq, mbs, gbs, args.warmup, args.iters, over,
                      os.path.dirname(args.out) or "." if args.profile else None)
        except Exception as e:  # OOM, a compile failure: report it and measure the next row
            row = dict(backend=backend, model=option, micro_batch=mbs, overrides=list(over), error=f"{type(e).__name__}: {str(e)[:300]}")
        gc.collect()  # after the except block: the exception's frames no longer hold the trainer
        torch.cuda.empty_cache()
        torch._dynamo.reset()
        print(json.dumps({k: v for k, v in row.items() if k != "lp0"}), flush=True)
        rows.append(row)
    parity = compile_parity(rows)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": [{k: v for k, v in r.items() if k != "lp0"} for r in rows], "compile_parity": parity}, f, indent=1)
    print("| backend | model | seq×gbs (mbs) | overrides | tokens/s | MFU (min-max) | step s median (min-max) | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" not in r:
            lo, hi = r["mfu_at_min_max"]
            print(f"| {r['backend']} | {r['model']} | {r['seq']}×{r['global_batch']} ({r['micro_batch']}) | "
                  f"{' '.join(r['overrides']) or '-'} | {r['tokens_per_s']} | {r['mfu']:.1%} ({lo:.1%}-{hi:.1%}) | "
                  f"{r['step_s']} ({r['step_min_s']}-{r['step_max_s']}) | {r['peak_mem_gib']} |")
    for p in parity:
        print("compile parity:", json.dumps(p))


if __name__ == "__main__":
    main()
