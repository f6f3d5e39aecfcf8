"""`python -m benchmarks.bench_megatron --mix` (GPU): the megatron backend on a realistic RL length mix, padded vs
packed vs packed + token budget (how much packing and a token budget per micro-batch gain).

The mix ("rl", seed 0): one RL step of `--mix-global-batch` samples (64) from prompts of 8 samples each; a prompt's
length uniform in [64, 512] tokens (its 8 samples share it), each response log-normal with median 700 and sigma 1
(round(700 exp(N(0, 1)))) clipped to [1, 8192]. Rows stay in rollout order (a prompt's samples together), as a
step's batch arrives; token ids are random, advantages random per sample. The drawn mean / median / max are printed.
Variants, for model=qwen3_4b and model=qwen3_0_6b (bf16, random init, megatron_settings.BEST: compiled layers, bf16
gradient buffers, compiled log-prob kernels, fused AdamW; no recompute):
- padded: train.qkv_format=bshd, micro-batches of train.micro_batch_size consecutive samples, each padded to its longest
- packed: train.qkv_format=thd, the same micro-batches, each packed into one stream (no padding)
- budget: train.qkv_format=thd, train.use_dynamic_batch_size=true, train.max_tokens_per_gpu (balanced bins of real tokens)
Micro-batch sizes and budgets (MODELS) are what fits one H200 without recompute, from the measured peaks: the 4B shape
holds ~61 GiB of weights, gradients and Adam state plus ~4.7 GiB per 1k tokens of a micro-batch (79.5 GiB at 2 x 2049
tokens, 98.2 at 4 x 2049: docs/gpu_results.md), so the 4B's micro-batch of 4 (its best row) would run this draw's
worst 4 consecutive samples padded to 22.2k tokens (~165 GiB): padded and packed use 2 (worst 11.1k padded, ~113 GiB),
the budget 10240 tokens (9 bins of ~9.3k, ~105 GiB; a margin for the dynamic-shape compiled graphs, whose memory was
never measured). The 0.6B: ~9 GiB + ~1.9 GiB per 1k tokens; micro-batch 8 (its best row; worst 44.4k padded, ~93 GiB),
budget 32768 (3 bins of ~28k, ~62 GiB).
One trainer per model, built once: each variant composes and validates its own overrides and hands the trainer its
batch spec (micro-batching and qkv format are all that differ); dynamo's recompile limit is raised to 32 so that the
padded and packed shapes of one trainer stay compiled. Dynamo compiles each graph set static at the first
micro-batch shape and dynamic in the token dimension at the second, as in a run; `--mix-dynamic-first`
(assume_static_by_default=False) skips the static compile (~0.5 min per graph set on the 4B shape, 4 sets in all) but
then every dimension dynamo does not tie to a weight (the log-prob kernels' vocabulary columns) stays symbolic, which
a run's graphs do not: faster to run, less faithful.
Per row: real tokens/s (the positions that predict a token, L_i - 1 per sample), MFU on real tokens only (per sample
6 N (L_i - 1) + 6 layers d_attn (L_i - 1)^2 FLOPs: megatron_settings.flops_per_token at the sample's own length, over
790 TFLOP/s), the padding fraction of the positions the model ran, step s (median and min-max of `iters` after
`warmup`), the first step's s (compiles), peak GiB, micro-batches per step and the largest one's tokens as run, and
the graphs dynamo compiled and graph breaks during the row. Then budget / padded real tokens/s per model.
"addition": the 1n1g addition experiments' shape (experiment=grpo/qwen3-0.6b-addition-1n1g-megatron-sglang-colocate-v1:
model=qwen3_0_6b, 256 samples per step, micro-batch 64, megatron settings as shipped: eager layers): prompts uniform in
[8, 12] tokens, responses uniform in [2, 6]: should those experiments pack?
`--tiny`: the embedded tiny model on CPU under the tests' megatron shim (tests/support/megatron_cpu/shim.py) with tiny
lengths, eager: the same code path, to see every variant produce a row before a GPU call.
Each row is printed (flushed) as it finishes and the JSON rewritten, so a run cut short keeps its rows.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from benchmarks.megatron_settings import BEST, PEAK, flops_per_token

NO_COMPILE = ("train.megatron.compile_layers=false", "train.megatron.compile_log_probs=false")


@dataclass(frozen=True)
class Shape:
    option: str | None  # model=...; None: the embedded default (tiny)
    mix: str  # lengths(): rl | addition | tiny
    micro_batch: int  # padded and packed
    budget: int  # train.max_tokens_per_gpu of the budget variant
    settings: tuple[str, ...]  # train.* of every variant
    global_batch: int | None = None  # None: --mix-global-batch


MODELS = {
    "qwen3_4b": Shape("qwen3_4b", "rl", 2, 10240, BEST),
    # slime's default micro-batch of 1 (the 1n8g recipes' setting before they packed): one sample per micro-batch, so
    # nothing is padded and the matmuls are as small as the samples
    "qwen3_4b_mb1": Shape("qwen3_4b", "rl", 1, 10240, BEST),
    "qwen3_0_6b": Shape("qwen3_0_6b", "rl", 8, 32768, BEST),
    "addition": Shape("qwen3_0_6b", "addition", 64, 8192, (), global_batch=256),
    "tiny": Shape(None, "tiny", 4, 96, NO_COMPILE, global_batch=16),
}
VARIANTS = ("budget", "padded", "packed")  # the budget first: a run cut short keeps the headline row and its ratio


DISTRIBUTION = {  # what lengths() draws, for the printed table
    "rl": "prompts uniform [64, 512] per prompt of 8 samples; responses round(700 exp(N(0,1))) in [1, 8192]; seed 0",
    "addition": "prompts uniform [8, 12] per prompt of 8 samples; responses uniform [2, 6]; seed 0",
    "tiny": "prompts uniform [4, 16] per prompt of 4 samples; responses round(12 exp(N(0,1))) in [1, 48]; seed 0",
}


def lengths(mix: str, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt, response) token counts [n] of one step's samples, prompts shared by groups of 8 (4 for tiny)."""
    g = torch.Generator().manual_seed(seed)
    group = 4 if mix == "tiny" else 8
    lo, hi = {"rl": (64, 512), "addition": (8, 12), "tiny": (4, 16)}[mix]
    prompt = torch.randint(lo, hi + 1, (-(-n // group),), generator=g).repeat_interleave(group)[:n]
    if mix == "addition":
        return prompt, torch.randint(2, 7, (n,), generator=g)
    median, cap = (700, 8192) if mix == "rl" else (12, 48)
    return prompt, (median * torch.exp(torch.randn(n, generator=g))).round().clamp(1, cap).long()


def mix_batch(prompt: torch.Tensor, response: torch.Tensor, vocab: int, seed: int = 0):
    """A right-padded TrainBatch: L_i = prompt + response tokens, the loss on the response's targets."""
    from slime_hydra.protocols import TrainBatch

    g = torch.Generator().manual_seed(seed)
    total = prompt + response
    n, width = len(total), int(total.max())
    pos = torch.arange(width)[None]
    attn = (pos < total[:, None]).long()  # [n, T+1]
    ids = torch.randint(3, vocab, (n, width), generator=g) * attn
    t = pos[:, :-1]  # position t predicts token t+1: the response's targets are prompt-1 .. L-2
    loss_mask = ((t >= prompt[:, None] - 1) & (t < total[:, None] - 1)).float()  # [n, T]
    adv = torch.randn(n, 1, generator=g) * loss_mask
    return TrainBatch(ids, attn, loss_mask, adv)


def real_flops(m, vocab: int, total: torch.Tensor) -> float:
    """FLOPs of one step over the real tokens: each sample's L_i - 1 positions, attention at its own length."""
    return sum(flops_per_token(m, s, vocab) * s for s in (total - 1).tolist())


def describe(prompt: torch.Tensor, response: torch.Tensor) -> dict:
    total = prompt + response
    stats = {}
    for name, x in (("prompt", prompt), ("response", response), ("sample", total)):
        stats[name] = dict(mean=round(x.float().mean().item(), 1), median=int(x.median()), max=int(x.max()), min=int(x.min()))
    return dict(samples=len(total), real_tokens=int((total - 1).sum()), **stats)


def compose(shape: Shape, variant: str, gbs: int, width: int, device: str):
    from slime_hydra.app.preflight import compose_run

    over = {"padded": ("train.qkv_format=bshd",), "packed": ("train.qkv_format=thd",),
            "budget": ("train.qkv_format=thd", "train.use_dynamic_batch_size=true",
                       f"train.max_tokens_per_gpu={shape.budget}")}[variant]
    model = [f"model={shape.option}"] if shape.option else []
    return compose_run([*model, "train=megatron", "train.lr=1e-6", "train.min_lr=0", "rollout.rollout_batch_size=1",
                        f"rollout.n_samples_per_prompt={gbs}", f"train.micro_batch_size={shape.micro_batch}",
                        "train.skip_zero_advantage_samples=false", f"model.max_position_embeddings={max(width + 1, 4096)}",
                        "num_rollout=1", f"cluster.device={device}", *shape.settings, *over]), list(over)


def build(cfg, vocab: int, device: torch.device):
    from slime_hydra.app.algorithm import algorithm_specs
    from slime_hydra.training.megatron.trainer import build_trainer

    m, s = cfg.model, algorithm_specs(cfg.algorithm, cfg.train, total_steps=100)
    return build_trainer(None, SimpleNamespace(vocab_size=vocab), m, cfg.parallelism, cfg.train.megatron, s, 1.0, device,
                         seed=cfg.seed)


def layout(trainer, batch) -> dict:
    """The step's micro-batches as the trainer forms them: count, the largest one's positions run, padding fraction."""
    r = trainer.runner
    mbs = r.micro_batches(batch, torch.arange(batch.num_samples))
    real = [int(mb.attention_mask.sum()) for mb in mbs]
    run = [n - mb.num_samples if r.thd else mb.num_samples * mb.input_ids.shape[1] for n, mb in zip(real, mbs)]
    ran = sum(run)
    return dict(micro_batches=len(mbs), max_micro_batch_tokens=max(run), samples_per_micro_batch=[mb.num_samples for mb in mbs],
                padding_frac=round(0.0 if r.thd else 1 - sum(real) / ran, 4))


def dynamo_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def timed(trainer, batch, warmup: int, iters: int, cuda: bool) -> tuple[float, list[float]]:
    """(first step s, the `iters` step times after `warmup` steps; the first step counts as a warm-up step)."""
    times = []
    for _ in range(max(warmup, 1) + iters):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        trainer.train_rollout(batch)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times[0], times[max(warmup, 1):]


def run_model(name: str, variants: list[str], gbs: int, warmup: int, iters: int, device: str, emit) -> list[dict]:
    from slime_hydra.app.algorithm import algorithm_specs

    shape = MODELS[name]
    gbs = shape.global_batch or gbs
    prompt, response = lengths(shape.mix, gbs)
    total = prompt + response
    cuda = device == "cuda"
    cfgs = {v: compose(shape, v, gbs, int(total.max()), device) for v in variants}
    first = cfgs[variants[0]][0]
    m, vocab = first.model, first.model.vocab_size
    if vocab is None:  # the embedded tiny model: its character tokenizer's
        from slime_hydra.models.build import build_tokenizer

        vocab = len(build_tokenizer(m))
    batch, flops = mix_batch(prompt, response, vocab), real_flops(m, vocab, total)
    head = dict(model=name, option=shape.option or "tiny", mix=shape.mix, distribution=DISTRIBUTION[shape.mix],
                global_batch=gbs, dtype=m.dtype, settings=list(shape.settings), **describe(prompt, response))
    emit(dict(head, kind="mix"))
    t0 = time.perf_counter()
    try:
        trainer = build(first, vocab, torch.device(device))
    except Exception as e:  # OOM, a megatron/torch mismatch: the model's rows are errors, the next model runs
        return [emit(dict(model=name, variant=v, error=f"build: {type(e).__name__}: {str(e)[:300]}")) for v in variants]
    build_s = time.perf_counter() - t0
    rows = []
    for v in variants:
        cfg, over = cfgs[v]
        trainer.runner.batch = algorithm_specs(cfg.algorithm, cfg.train, total_steps=100).batch
        trainer.runner.thd = trainer.runner.batch.qkv_format == "thd"
        row = dict(model=name, variant=v, overrides=over, micro_batch_size=shape.micro_batch if v != "budget" else None,
                   max_tokens_per_gpu=shape.budget if v == "budget" else None, build_s=round(build_s, 1))
        try:
            row |= layout(trainer, batch)
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            g0, b0 = dynamo_counts()
            first_s, times = timed(trainer, batch, warmup, iters, cuda)
            g1, b1 = dynamo_counts()
            step = statistics.median(times)
            real = head["real_tokens"]
            row |= dict(step_s=round(step, 4), step_min_s=round(min(times), 4), step_max_s=round(max(times), 4),
                        first_step_s=round(first_s, 2), iters=len(times), real_tokens_per_s=round(real / step),
                        mfu_real=round(flops / step / PEAK, 4),
                        mfu_real_at_max_min=[round(flops / t / PEAK, 4) for t in (max(times), min(times))],
                        peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None,
                        compiled_graphs=g1 - g0, graph_breaks=b1 - b0)
        except Exception as e:  # report it and measure the next variant
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        gc.collect()
        rows.append(emit(row))
    del trainer
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    torch._dynamo.reset()
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """budget / padded and packed / padded real tokens/s, per model."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows if "variant" in r):
        by = {r["variant"]: r for r in rows if r.get("model") == model and "real_tokens_per_s" in r}
        if "padded" in by:
            out.append(dict(model=model, **{f"{v}_over_padded": round(by[v]["real_tokens_per_s"] / by["padded"]["real_tokens_per_s"], 3)
                                            for v in ("budget", "packed") if v in by}))
    return out


def table(rows: list[dict]) -> list[str]:
    lines = ["| model | variant | micro-batches (largest, tokens run) | padding | real tokens/s | MFU real (min-max) | "
             "step s (min-max) | first step s | peak GiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("kind") == "mix" or "variant" not in r:
            continue
        if "error" in r:
            lines.append(f"| {r['model']} | {r['variant']} | error: {r['error'][:120]} |||||||")
            continue
        how = f"mbs {r['micro_batch_size']}" if r["micro_batch_size"] else f"budget {r['max_tokens_per_gpu']}"
        lo, hi = r["mfu_real_at_max_min"]
        lines.append(f"| {r['model']} | {r['variant']} ({how}) | {r['micro_batches']} ({r['max_micro_batch_tokens']}) | "
                     f"{r['padding_frac']:.1%} | {r['real_tokens_per_s']} | {r['mfu_real']:.1%} ({lo:.1%}-{hi:.1%}) | "
                     f"{r['step_s']} ({r['step_min_s']}-{r['step_max_s']}) | {r['first_step_s']} | {r['peak_mem_gib']} |")
    return lines


def main(models: list[str], variants: list[str], gbs: int, warmup: int, iters: int, out: str, tiny: bool,
         dynamic_first: bool = False) -> None:
    device = "cpu" if tiny else "cuda"
    if tiny:  # megatron-core on CPU: the tests' shim (test-only code; a GPU run never installs it)
        from tests.support.megatron_cpu import shim

        shim.install()
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    from slime_hydra.config.store import register

    register()
    cfg = torch._dynamo.config
    for key in ("recompile_limit", "cache_size_limit"):  # the padded and packed shapes of one trainer, compiled
        if hasattr(cfg, key):
            setattr(cfg, key, max(getattr(cfg, key), 32))
    if dynamic_first:
        cfg.assume_static_by_default = False  # parameters stay static (force_parameter_static_shapes)
    rows: list[dict] = []
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)

    def emit(row: dict) -> dict:
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(out, "w") as f:
            json.dump({"rows": rows, "ratios": ratios(rows)}, f, indent=1)
        return row

    t0 = time.perf_counter()
    for name in models:
        run_model(name, variants, gbs, warmup, iters, device, emit)
        print(f"# {name} done at {time.perf_counter() - t0:.0f} s", flush=True)
    report(rows)


def report(rows: list[dict]) -> None:
    """The table, the drawn mixes, each row's warm-up (build, first step, graphs compiled, graph breaks), the ratios."""
    for line in table(rows):
        print(line)
    for r in rows:
        if r.get("kind") == "mix":
            print(f"mix {r['model']} ({r['distribution']}): {r['samples']} samples, {r['real_tokens']} real tokens; "
                  f"drawn prompt {r['prompt']}; response {r['response']}; sample {r['sample']}")
    for r in rows:
        if "variant" in r:
            print({k: r[k] for k in ("model", "variant", "build_s", "first_step_s", "compiled_graphs", "graph_breaks", "error")
                   if r.get(k) is not None})
    for r in ratios(rows):
        print("ratio:", json.dumps(r))
