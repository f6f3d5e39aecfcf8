"""Rollout backends on CPU, in one run: `local` vs `sglang` (two engines behind the router).

For each backend: the same model (the embedded tiny Qwen3, random init), the same prompts (the
addition training set), `--prompts` × `--n` samples of up to `--tokens` new tokens (both stop on eos), `--reps` timed rollouts after one
warm-up; then `--reps` weight syncs of the model's weights (local: an in-process copy; sglang: bucketed
from tensors into both engines, inside pause/continue, then over one gloo update group per engine). Figures: rollout tokens/s (response tokens /
wall time of `generate`), weight-sync seconds (median). Engine start time is reported, not counted.
On CPU this mostly measures per-request and process overheads on a ~1M-parameter model; it says
nothing about GPU throughput (benchmarks/bench_sglang_gpu.py does that).

Run: HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.bench_rollout   (`make bench-rollout`)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from slime_hydra.app.build import build_rollout
from slime_hydra.app.preflight import compose_run
from slime_hydra.data.dataset import load_prompts
from slime_hydra.data.source import prompt_group
from slime_hydra.models.build import build_model, build_tokenizer
from slime_hydra.types import SamplingParams

SGLANG = ["rollout=sglang_cpu", "cluster.device=cpu", "cluster.rollout_num_gpus=2"]


def bench(backend_overrides: list[str], args, out: Path) -> list[dict]:
    cfg = compose_run(["num_rollout=1", "logger=none", *backend_overrides])
    tok = build_tokenizer(cfg.model)
    model = build_model(cfg.model, tok, cfg.seed)
    prompts = load_prompts(cfg.data.prompt_data, tok, input_key=cfg.data.input_key, label_key=cfg.data.label_key)
    t0 = time.perf_counter()
    rollout = build_rollout(cfg, model, tok, str(out))
    start_s = time.perf_counter() - t0
    # both stop on eos (random init: ~1/59 per token), so the work per sample is the same in distribution
    sp = SamplingParams(1.0, 1.0, -1, args.tokens, (tok.eos_token_id,))
    try:
        rollout.update_weights(model.named_parameters(), version=0)
        rates = []
        for rep in range(args.reps + 1):
            samples = [s for i, p in enumerate(prompts[rep * args.prompts:(rep + 1) * args.prompts])
                       for s in prompt_group(p, i, args.n)]
            t = time.perf_counter()
            asyncio.run(rollout.generate(samples, sp))
            dt = time.perf_counter() - t
            if rep:  # the first is a warm-up
                rates.append(sum(s.response_length for s in samples) / dt)
        syncs: dict[str, list[float]] = {}
        # sglang: the same engines synced from tensors (colocated) and over gloo update groups (disaggregated)
        for mode in (["tensor", "distributed"] if cfg.rollout.backend == "sglang" else ["copy"]):
            if mode != "copy":
                rollout.mode = mode
            for v in range(1, args.reps + 1):
                named = [(n, p.detach()) for n, p in model.named_parameters()]
                t = time.perf_counter()
                rollout.update_weights(named, version=v)
                syncs.setdefault(mode, []).append(time.perf_counter() - t)
    finally:
        rollout.shutdown()
    return [{"backend": cfg.rollout.backend if mode == "copy" else f"{cfg.rollout.backend} ({mode})",
             "rollout_tokens_per_s": statistics.median(rates), "weight_sync_s": statistics.median(times),
             "start_s": start_s, "weight_mb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20}
            for mode, times in syncs.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="bench_out/rollout.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_rollout_") as tmp:
        rows = [*bench(["cluster.device=cpu"], args, Path(tmp) / "local"), *bench(SGLANG, args, Path(tmp) / "sglang")]
    print(f"\n{args.prompts} prompts × {args.n} samples × {args.tokens} new tokens, median of {args.reps}; CPU\n")
    print(f"{'rollout.backend':<22}{'rollout tok/s':>15}{'weight sync s':>15}{'engine start s':>16}")
    for r in rows:
        print(f"{r['backend']:<22}{r['rollout_tokens_per_s']:>15.0f}{r['weight_sync_s']:>15.3f}{r['start_s']:>16.1f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
