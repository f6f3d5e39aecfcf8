"""(GPU) SGLang rollout through slime_hydra's backend on one GPU: throughput vs the raw engine, weight sync, GRPO.

Parts (each prints its table and writes <out>/<part>.json):
- `throughput`: a Qwen3-0.6B-shaped model (random init, bf16, the project's tokenizer; token ids in and
  out). The raw offline `sgl.Engine` generates `--batch` prompts of `--prompt-len` random token ids,
  `--new-tokens` each (ignore_eos), without and with logprobs; then the same prompts go through the
  backend (`build_rollout`: an SGLang server behind the sglang-router, the async client, logprobs), one
  sample per request and batched; the ratio backend / raw-with-logprobs is printed. Then weight sync from
  the model's CUDA tensors (`update_weights`, inside pause/continue, per `update_weight_buffer_size`),
  the engine-vs-trainer equality check (and that it fails when they differ), and release/resume of
  the engine's memory (`enable_memory_saver`) with the GPU's free memory before and after.
- `grpo`, `sync`, `async`: the real CLI (`python -m slime_hydra`) on that model shape, trainer and engine
  colocated on the GPU, weights synced from tensors every rollout. `grpo` releases the engine's memory
  around training and checks the engine's weights against the trainer's after every sync; `sync` and
  `async` (train_mode=async) are the issue-8 pair through the CLI, one process (and one engine start) each,
  on the task of benchmarks/bench_async_sglang.py. Per-rollout times come from the run's TensorBoard
  events; sample weight versions from save_debug_rollout_data.
- `pair`: the issue-8 pair in one process sharing one engine start (benchmarks/bench_async_sglang.py):
  sync and async from the same initial weights and prompts, with the start-up broken down.
- `all`: the parts in order, each only while enough of `--deadline-s` is left; parts already done in an
  earlier call on the same machine (`--state` directory) are skipped and their results copied to `--out`.

Run on the GPU machine: python3 -m benchmarks.bench_sglang_gpu all --out $OUT   (`make bench-sglang-gpu`)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODEL = ["model=qwen3_0_6b", "rollout=sglang", "cluster.device=cuda", "+rollout.sglang.skip_tokenizer_init=true"]
# 32 prompts x 8 samples x up to 256 new tokens per rollout (a random model rarely samples eos)
# 32 samples per /generate (one per request kept 0.57 of the raw rate on the H200, 32 kept 0.92); no prefill
# CUDA graphs (their capture took most of a 120 s engine start there; decode graphs stay)
SHAPE = ["rollout.rollout_batch_size=32", "rollout.n_samples_per_prompt=8", "rollout.rollout_max_response_len=256",
         "train.micro_batch_size=32", "rollout.sglang_request_batch_size=32", "+rollout.sglang.disable_prefill_cuda_graph=true"]
RUNS = {"grpo": ["num_rollout=3", "+rollout.sglang.enable_memory_saver=true", "rollout.check_weight_update_equal=true"]}
PAIR_ROLLOUTS = 10  # sync/async (CLI) and pair: rollouts per mode
# --smoke: the same code paths on CPU with the tiny model and the CPU engine flags (checks the script, not speed)
SMOKE_MODEL = ["rollout=sglang_cpu", "cluster.device=cpu"]
SMOKE_SHAPE = ["rollout.rollout_batch_size=4", "rollout.n_samples_per_prompt=2", "rollout.rollout_max_response_len=8",
               "train.micro_batch_size=8"]
MiB = 2**20


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- throughput, weight sync, memory ------------------------------------------------------------------

def raw_engine(model_dir: Path, prompts: list[list[list[int]]], new_tokens: int, options: dict, seed: int) -> dict:
    """The offline engine with the backend's server arguments (less the memory saver)."""
    import sglang as sgl

    t0 = time.perf_counter()
    options = {k: v for k, v in options.items() if k != "enable_memory_saver" and v is not None}
    eng = sgl.Engine(model_path=str(model_dir), random_seed=seed, log_level="error", **options)
    out = {"start_s": time.perf_counter() - t0}
    sp = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0, "top_p": 1.0}
    try:
        for logprob in (False, True):
            rates = []
            for i, batch in enumerate(prompts):  # the first is a warm-up
                t = time.perf_counter()
                got = eng.generate(input_ids=batch, sampling_params=sp, return_logprob=logprob)
                dt = time.perf_counter() - t
                tokens = sum(len(g["output_ids"]) for g in got)
                if i:
                    rates.append(tokens / dt)
            out["tok_s_logprobs" if logprob else "tok_s"] = statistics.median(rates)
    finally:
        eng.shutdown()
    return out


def backend_generate(rollout, prompts: list[list[int]], sp, request_batch: int) -> tuple[float, list]:
    from slime_hydra.types import Sample

    rollout.cfg.sglang_request_batch_size = request_batch
    samples = [Sample(prompt="", index=i, group_index=i, prompt_tokens=p) for i, p in enumerate(prompts)]
    t = time.perf_counter()
    asyncio.run(rollout.generate(samples, sp))
    return time.perf_counter() - t, samples


def throughput(args, out: Path) -> dict:
    import torch

    from slime_hydra.app.build import build_rollout
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.models.build import build_model, build_tokenizer
    from slime_hydra.protocols import InProcessWeights
    from slime_hydra.rollout.sglang import weights as W
    from slime_hydra.types import SamplingParams

    model_args = SMOKE_MODEL if args.smoke else [*MODEL, "+rollout.sglang.enable_memory_saver=true"]
    cfg = compose_run([*model_args, "num_rollout=1", "logger=none", "eval=none"])
    cuda = cfg.cluster.device == "cuda"
    tok = build_tokenizer(cfg.model)
    model = build_model(cfg.model, tok, cfg.seed).to(cfg.cluster.device)
    vocab = cfg.model.vocab_size or len(tok)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    params = sum(p.numel() for p in model.parameters())
    log(f"model {cfg.model.name}: {params / 1e6:.0f}M parameters, {weight_bytes / MiB:.0f} MiB bf16")
    model_dir = out / "model"
    model.save_pretrained(model_dir, safe_serialization=True)
    tok.save_pretrained(model_dir)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, vocab, (args.reps + 1, args.batch, args.prompt_len), generator=g).tolist()
    res: dict = {"batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "reps": args.reps,
                 "params_m": params / 1e6, "weight_mb": weight_bytes / MiB,
                 "mem_fraction_static": cfg.rollout.sglang.get("mem_fraction_static")}
    log("raw sgl.Engine ...")
    res["raw"] = raw_engine(model_dir, prompts, args.new_tokens, {**cfg.rollout.sglang, "dtype": cfg.model.dtype}, cfg.seed)
    log(f"raw: {res['raw']}")

    log("backend (server + router + client) ...")
    t0 = time.perf_counter()
    rollout = build_rollout(cfg, model, tok, str(out / "backend"))
    res["backend_start_s"] = time.perf_counter() - t0
    sp = SamplingParams(1.0, 1.0, -1, args.new_tokens, ())  # no stop ids; eos from a random model: ~1 in 150k tokens
    try:
        rollout.offload = False  # timing generate alone; release/resume is measured below
        rollout.update_weights(InProcessWeights.of((n, p.detach()) for n, p in model.named_parameters()), version=0)
        for rb in (1, 32):
            rates, short = [], 0
            for i, batch in enumerate(prompts):
                dt, samples = backend_generate(rollout, batch, sp, rb)
                if i:
                    rates.append(sum(s.response_length for s in samples) / dt)
                    short += sum(s.response_length < args.new_tokens for s in samples)
                    assert all(len(s.rollout_log_probs) == s.response_length for s in samples)
            res[f"backend_rb{rb}"] = {"tok_s": statistics.median(rates), "stopped_early": short}
            log(f"backend, {rb} sample(s) per request: {res[f'backend_rb{rb}']}")

        syncs = {}
        named = lambda: [(n, p.detach()) for n, p in model.named_parameters()]  # noqa: E731
        version = 0
        for buf in ((128 * MiB, 512 * MiB, 2048 * MiB) if cuda else (MiB, 512 * MiB)):
            rollout.cfg.update_weight_buffer_size = buf
            times = []
            for _ in range(args.reps + 1):
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1.0001)  # new weights each sync
                version += 1
                t = time.perf_counter()
                rollout.update_weights(InProcessWeights.of(named()), version=version)
                times.append(time.perf_counter() - t)
            syncs[f"{buf // MiB}MiB"] = {"buckets": sum(1 for _ in W.buckets(named(), buf)), "first_s": times[0],
                                        "median_s": statistics.median(times[1:])}
            log(f"weight sync, buffer {buf // MiB} MiB: {syncs[f'{buf // MiB}MiB']}")
        res["weight_sync"] = syncs
        url = rollout.group.engines[0].endpoint
        t = time.perf_counter()
        n = W.check_equal(url, named(), cfg.model.dtype, 600)
        res["check_equal"] = {"tensors": n, "s": time.perf_counter() - t}
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight.add_(0.5)  # the trainer moves on without a sync
        try:
            W.check_equal(url, named(), cfg.model.dtype, 600)
            res["check_equal"]["detects_difference"] = False
        except W.WeightSyncError as e:
            res["check_equal"]["detects_difference"] = True
            res["check_equal"]["message"] = str(e)[:200]
        log(f"check_weight_update_equal: {res['check_equal']}")
        dt, samples = backend_generate(rollout, prompts[0][:64], SamplingParams(1.0, 1.0, -1, 16, ()), 1)
        res["weight_version_after_sync"] = sorted({s.weight_version for s in samples})

        free = (lambda: torch.cuda.mem_get_info()[0]) if cuda else (lambda: 0)  # noqa: E731
        free0 = free()
        t = time.perf_counter()
        # every tag, the weights too (cluster.offload_rollout keeps them); skipped on CPU (the server does not support it)
        rollout.release_memory(tags=("kv_cache", "weights", "cuda_graph"))
        t_rel = time.perf_counter() - t
        free1 = free()
        t = time.perf_counter()
        if rollout._released:
            rollout.resume_memory()
        t_res = time.perf_counter() - t
        free2 = free()
        version += 1
        rollout.update_weights(InProcessWeights.of(named()), version=version)  # released weights are gone: resync after resume
        W.check_equal(url, named(), cfg.model.dtype, 600)
        dt, samples = backend_generate(rollout, prompts[1], sp, 1)
        res["memory"] = {"free_gib_before": free0 / 2**30, "free_gib_released": free1 / 2**30,
                         "free_gib_resumed": free2 / 2**30, "release_s": t_rel, "resume_s": t_res,
                         "tok_s_after_resume": sum(s.response_length for s in samples) / dt}
        log(f"release/resume: {res['memory']}")
    finally:
        rollout.shutdown()
    raw = res["raw"]["tok_s_logprobs"]
    res["ratio_rb1"] = res["backend_rb1"]["tok_s"] / raw
    res["ratio_rb32"] = res["backend_rb32"]["tok_s"] / raw
    print(f"\nthroughput ({args.batch} prompts x {args.prompt_len} tokens, {args.new_tokens} new, median of {args.reps})")
    print(f"  raw sgl.Engine            {res['raw']['tok_s']:>9.0f} tok/s   with logprobs {raw:>9.0f} tok/s")
    for rb in (1, 32):
        b = res[f"backend_rb{rb}"]
        print(f"  backend, {rb:>2}/request       {b['tok_s']:>9.0f} tok/s   ratio {b['tok_s'] / raw:.3f}")
    print("weight sync from tensors (s): " + ", ".join(f"{k}: {v['median_s']:.3f} ({v['buckets']} buckets)"
                                                     for k, v in syncs.items()))
    return res


# -- the engine loop through the CLI -----------------------------------------------------------------

def tb_scalars(tb_dir: Path) -> dict[int, dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    steps: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            steps.setdefault(e.step, {})[tag] = e.value
    return steps


def engine_run(name: str, args, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / f"run_{name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    if name in ("sync", "async"):  # the issue-8 task (bench_async_sglang), one process per mode
        from benchmarks.bench_async_sglang import overrides as pair_overrides

        task = [o for o in pair_overrides(args.smoke, name, 2 if args.smoke else PAIR_ROLLOUTS) if not o.startswith("logger")]
        overrides = [*task, "logger=tensorboard", f"hydra.run.dir={run_dir}", f"save_debug_rollout_data={run_dir}/rollouts"]
    else:
        base = [*SMOKE_MODEL, *SMOKE_SHAPE] if args.smoke else [*MODEL, *SHAPE]
        # smoke: two rollouts, no memory saver (CPU)
        run = [o for o in RUNS[name] if not (args.smoke and ("enable_memory_saver" in o or o.startswith("num_rollout=")))]
        overrides = [*base, "eval=none", "logger=tensorboard", *run, *(["num_rollout=2"] if args.smoke else []),
                     f"hydra.run.dir={run_dir}", f"save_debug_rollout_data={run_dir}/rollouts"]
    cmd = [sys.executable, "-m", "slime_hydra", *overrides]
    log(" ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.run_timeout_s)
    wall = time.perf_counter() - t0
    (out / f"{name}.log").write_text(proc.stdout)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise RuntimeError(f"{name}: exit code {proc.returncode}")
    try:
        return summarize_run(name, run_dir, overrides, wall)
    except Exception:
        print(proc.stdout[-3000:])  # the run's own summary table, whatever failed here
        raise


def summarize_run(name: str, run_dir: Path, overrides: list[str], wall: float) -> dict:
    steps = tb_scalars(run_dir / "tensorboard")
    versions = {}
    for f in sorted((run_dir / "rollouts").glob("*.jsonl")):
        vs = set()
        for line in f.read_text().splitlines():
            d = json.loads(line)
            vs.add(d.get("weight_version"))
        versions[str(int(f.stem.split("_")[-1]))] = sorted(v for v in vs if v is not None)  # rollout_000000.jsonl
    keys = ["perf/rollout_time_s", "perf/train_time_s", "perf/weight_sync_time_s", "perf/step_time_s",
            "perf/weight_sync_send_s", "rollout/weight_sync_requests", "perf/rollout_tokens_per_s", "rollout/weight_version_lag_mean", "rollout/response_len_mean",
            "perf/rollout_wait_s", "perf/rollout_generate_s"]
    rows = {s: {k: m[k] for k in keys if k in m} for s, m in sorted(steps.items()) if s > 0}
    later = [r["perf/step_time_s"] for s, r in rows.items() if s > 1 and "perf/step_time_s" in r]
    res = {"overrides": overrides, "process_wall_s": wall, "steps": rows, "sample_weight_versions": versions,
           "step_time_mean_after_first_s": statistics.mean(later) if later else None}
    print(f"\n{name}: {' '.join(RUNS.get(name, overrides))}")
    print(f"  {'step':>4} {'rollout s':>10} {'train s':>8} {'sync s':>7} {'step s':>7} {'rollout tok/s':>14} {'lag':>5}  versions")
    for s, r in rows.items():
        print(f"  {s:>4} {r.get('perf/rollout_time_s', 0):>10.2f} {r.get('perf/train_time_s', 0):>8.2f} "
              f"{r.get('perf/weight_sync_time_s', 0):>7.3f} {r.get('perf/step_time_s', 0):>7.2f} "
              f"{r.get('perf/rollout_tokens_per_s', 0):>14.0f} {r.get('rollout/weight_version_lag_mean', 0):>5.2f}  "
              f"{versions.get(f'{s - 1}', '?')}")
    print(f"  mean step time after the first: {res['step_time_mean_after_first_s']}; process wall {wall:.0f} s")
    return res


# -- driver --------------------------------------------------------------------------------------------

PARTS = {"throughput": 330, "grpo": 140, "sync": 200, "async": 200, "pair": 300}  # seconds each may need (start + work)


def pair(args, out: Path, deadline_s: float) -> dict:
    from benchmarks import bench_async_sglang

    argv = ["--out", str(out), "--rollouts", str(2 if args.smoke else PAIR_ROLLOUTS), "--order", args.pair_order,
            "--deadline-s", str(deadline_s), *(["--smoke"] if args.smoke else [])]
    return bench_async_sglang.main(argv)


def run_part(name: str, args, out: Path, left_s: float) -> dict:
    if name == "pair":
        return pair(args, out, left_s)
    return throughput(args, out) if name == "throughput" else engine_run(name, args, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=[*PARTS, "all"])
    ap.add_argument("--out", default="bench_out/sglang_gpu")
    ap.add_argument("--state", default="/tmp/slime_gpu_state", help="results kept across calls on one machine")
    ap.add_argument("--deadline-s", type=float, default=560.0, help="all: start a part only if its estimate fits")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--run-timeout-s", type=float, default=400.0)
    ap.add_argument("--parts", default=",".join(PARTS), help="all: which parts, in order")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny model, CPU engine flags (checks the script)")
    ap.add_argument("--pair-order", default="sync,async,async,sync", help="pair: the modes in the order they run")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out, state = Path(args.out), Path(args.state)
    out.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    names = args.parts.split(",") if args.part == "all" else [args.part]
    for name in names:
        done = state / f"{name}.json"
        if done.exists():
            shutil.copy(done, out / done.name)
            log(f"{name}: done in an earlier call ({done})")
            continue
        left = args.deadline_s - (time.perf_counter() - t0)
        if args.part == "all" and left < PARTS[name]:
            log(f"{name}: skipped ({left:.0f} s left, needs ~{PARTS[name]} s); run again while the machine is warm")
            continue
        log(f"{name}: start ({left:.0f} s left)")
        work = state / "work" / name
        try:
            res = run_part(name, args, work, left)
        except Exception as e:  # noqa: BLE001 - the other parts still run
            log(f"{name}: FAILED {type(e).__name__}: {e}")
            for f in work.glob("**/*.log"):
                print(f"--- {f}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-40:]))
            continue
        res["part_wall_s"] = time.perf_counter() - t0
        done.write_text(json.dumps(res, indent=2, default=str))
        shutil.copy(done, out / done.name)
    if all((state / f"{n}.json").exists() for n in ("sync", "async")):
        s, a = (json.loads((state / f"{n}.json").read_text())["step_time_mean_after_first_s"] for n in ("sync", "async"))
        print(f"\nsync vs async: wall time per rollout (mean after the first): sync {s:.2f} s, async {a:.2f} s, "
              f"sync/async {s / a:.2f}x")


if __name__ == "__main__":
    main()
