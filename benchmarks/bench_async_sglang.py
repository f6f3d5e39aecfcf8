"""(GPU) train_mode=sync vs train_mode=async with the SGLang rollout on one GPU (the H200
comparison in docs/gpu_results.md).

What runs: the real engine loop (`engine/loop.py`, its feeds in `engine/feeds.py`) over components from
`app/build.py`, in one process. The SGLang engine (server + sglang-router, colocated with the torch
trainer on the GPU, engine memory kept) starts once and serves every mode in `--order`: a start-up of
~1-2 minutes is paid once, not per mode. Each mode starts from the same state: the initial weights
(restored from a copy taken right after the build), a new optimizer (a new trainer), a new prompt source
with the same `rollout_seed` (the same prompts in the same order), a new reward scorer, and `prepare()`
syncs the initial weights to the engine as version 0. Both modes compose the same overrides; only
`train_mode` differs. The engine's sampling RNG is not reset between modes (noise only).

The task makes generation and training both substantial and the reward learnable:
- no warm start: a random-init Qwen3-0.6B shape samples eos about once in 151,936 tokens, so responses
  run to `rollout_max_response_len` (`rollout/response_len_mean` is reported per rollout);
- `token_share` (below): the share of response token ids that are `residue` modulo `modulus`, 1/8 of the
  vocabulary, so 0.125 for a uniform policy. It differs per sample (every group has a nonzero reward std,
  every sample trains) and a policy raises it by moving probability onto that subset of ids;
- `algorithm.use_rollout_logprobs=true` in both modes (async needs it; in sync it only spares a forward
  pass for the second optimizer step), so both modes do the same training compute.

Measured: the start-up phases (imports, compose, build: data, model, trainer, engine start, the rest of the
rollout's set-up), the engine's own log lines for weight load and CUDA graph capture, then per mode and
rollout the loops' perf/* metrics (async also `perf/rollout_generate_s`, the generation that overlaps
training), reward, response length, weight-version lag, and the GPU's utilisation sampled by nvidia-smi.

Figures (H200, 2026-12-01): docs/gpu_results.md, "train_mode=sync vs async" (sync/async 1.33x; why not 1.5x on one GPU).
Run (GPU machine): python3 -m benchmarks.bench_async_sglang --out $OUT [--lr 1e-3] (`bench_sglang_gpu all --parts pair`)
CPU check of the same path: .venv/bin/python -m benchmarks.bench_async_sglang --smoke --rollouts 2
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

MODULUS, RESIDUE = 8, 0


def token_share(sample, modulus: int = MODULUS, residue: int = RESIDUE) -> float:
    """Share of the response's token ids that are `residue` mod `modulus` (1/modulus for a uniform policy)."""
    ids = sample.response_tokens
    return sum(1 for t in ids if t % modulus == residue) / len(ids) if ids else 0.0


# Qwen3-0.6B shape, random init, token ids in and out; trainer and engine colocated on the GPU
GPU = ["model=qwen3_0_6b", "rollout=sglang", "cluster.device=cuda", "+rollout.sglang.skip_tokenizer_init=true",
       "cluster.offload_rollout=false",  # engine memory kept: async generates while the trainer trains
       # start-up: no prefill CUDA graphs (their capture was most of a 120 s start), six decode graph sizes
       # (sglang's default list has ~50 up to 256), no server warm-up request (the router check sends one)
       "+rollout.sglang.disable_prefill_cuda_graph=true", "+rollout.sglang.cuda_graph_bs_decode=[1,8,32,64,128,256]",
       "+rollout.sglang.skip_server_warmup=true",
       # 32 prompts x 8 samples x 256 tokens per rollout, 2 optimizer steps of 128 samples, micro-batches of 32
       "rollout.rollout_batch_size=32", "rollout.n_samples_per_prompt=8", "rollout.rollout_max_response_len=256",
       "train.num_steps_per_rollout=2", "train.micro_batch_size=32"]
SMOKE = ["rollout=sglang_cpu", "cluster.device=cpu", "rollout.rollout_batch_size=4", "rollout.n_samples_per_prompt=2",
         "rollout.rollout_max_response_len=8", "train.num_steps_per_rollout=2", "train.micro_batch_size=4"]
TASK = ["warmstart.steps=0", "eval=none", "logger=none", "logger.progress_bar=false",
        f"+reward.custom_rm._target_={__name__ if __name__ != '__main__' else 'benchmarks.bench_async_sglang'}.token_share",
        "algorithm.use_rollout_logprobs=true"]
LR = 2e-4  # bf16 weights (~0.02): Adam steps much below ~1e-4 round away in bf16
KEYS = ["perf/step_time_s", "perf/rollout_time_s", "perf/rollout_generate_s", "perf/train_time_s", "perf/weight_sync_time_s",
        "perf/rollout_tokens_per_s", "rollout/reward_mean", "rollout/reward_std", "rollout/response_len_mean",
        "rollout/truncated_ratio", "rollout/weight_version_lag_mean", "rollout/weight_version_lag_max",
        "rollout/weight_version", "train/pg_loss", "train/ppo_kl", "train/pg_clipfrac", "train/grad_norm"]
ENGINE_LOG = ("=== ", "Load weight", "Capture cuda graph", "KV Cache is allocated", "fired up", "startup complete")


def overrides(smoke: bool, mode: str, rollouts: int, lr: float = LR) -> list[str]:
    return [*(SMOKE if smoke else GPU), *TASK, f"train.lr={lr:g}", f"num_rollout={rollouts}", f"train_mode={mode}"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


class Timer:
    def __init__(self):
        self.phases: dict[str, float] = {}

    def wrap(self, module, name: str) -> None:
        """Time every call of module.<name> (the build's steps), summed under `name`."""
        fn = getattr(module, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t

        setattr(module, name, timed)


class GpuUtil:
    """nvidia-smi sampling GPU utilisation (% of time a kernel ran) and memory every 200 ms, while a mode runs."""

    def __init__(self, path: Path):
        self.path, self.proc = path, None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                                          "-lms", "200"], stdout=open(path, "w"), stderr=subprocess.DEVNULL)

    def stop(self) -> dict:
        if self.proc is None:
            return {}
        self.proc.terminate()
        self.proc.wait(timeout=10)
        rows = [[float(x) for x in line.split(",")] for line in self.path.read_text().splitlines() if line.count(",") == 1]
        if not rows:
            return {}
        return {"util_mean_pct": statistics.mean(r[0] for r in rows), "samples": len(rows),
                "mem_used_max_mib": max(r[1] for r in rows)}


def fresh_components(cfg, c, init_state: dict, out: Path):
    """Components for a new mode: the initial weights, a new trainer and optimizer, a new prompt source and
    buffer (same rollout_seed, so the same prompts in the same order), a new scorer; the same engine."""
    import torch  # noqa: F401 - imported here so the import time counts

    from slime_hydra.app.algorithm import run_specs
    from slime_hydra.app.build import build_trainer
    from slime_hydra.app.plugins import load_target, reward_scorer
    from slime_hydra.data.buffer import DataBuffer
    from slime_hydra.data.source import PromptSource
    from slime_hydra.engine.components import Components
    from slime_hydra.runtime import pick_device, seed_everything
    from slime_hydra.tracking.base import NullTracker

    model = c.trainer.model
    c.trainer = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    seed_everything(cfg.seed)
    with torch.no_grad():
        model.load_state_dict(init_state)
    specs = run_specs(cfg)
    trainer = build_trainer(cfg, specs, model, pick_device(cfg.cluster.device))
    r = cfg.rollout
    source = PromptSource(c.train_prompts, r.n_samples_per_prompt, r.rollout_shuffle, r.rollout_seed)
    return Components(c.tokenizer, c.train_prompts, c.eval_sets, source, trainer, c.rollout, reward_scorer(cfg.reward),
                      NullTracker(), c.sampling, specs.advantage, output_dir=str(out), buffer=DataBuffer(source, load_target(r.buffer_filter)))


def run_mode(cfg, c, mode: str, out: Path, order: int) -> dict:
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    util = GpuUtil(out / f"gpu_util_{order}_{mode}.csv")
    t = time.perf_counter()
    history = loop.run(loop_settings(cfg), c, str(out / "checkpoints"))
    wall = time.perf_counter() - t
    gpu = util.stop()
    rows = {step: {k: m[k] for k in KEYS if k in m} for step, m in history if "perf/step_time_s" in m}
    steps = [r["perf/step_time_s"] for r in rows.values()]
    rewards = [r["rollout/reward_mean"] for r in rows.values()]
    later = lambda key: statistics.mean(r[key] for s, r in rows.items() if s > 1 and key in r) if len(rows) > 1 else None  # noqa: E731
    res = {"mode": mode, "wall_s": wall, "steps_sum_s": sum(steps), "outside_steps_s": wall - sum(steps),
           "mean_step_after_first_s": later("perf/step_time_s"), "mean_train_after_first_s": later("perf/train_time_s"),
           "mean_rollout_after_first_s": later("perf/rollout_time_s"), "gpu": gpu, "rows": rows,
           "reward_first": rewards[0], "reward_last": rewards[-1], "reward_last3_mean": statistics.mean(rewards[-3:])}
    if mode == "async":
        res["mean_generate_after_first_s"] = later("perf/rollout_generate_s")
    print(f"\n{mode}: {len(rows)} rollouts in {wall:.1f} s ({sum(steps):.1f} s in the steps); GPU {gpu}")
    print(f"  {'step':>4} {'rollout s':>9} {'gen s':>6} {'train s':>7} {'sync s':>6} {'step s':>6} {'reward':>7} "
          f"{'resp len':>8} {'lag':>4} {'lag max':>7}")
    for s, r in rows.items():
        print(f"  {s:>4} {r['perf/rollout_time_s']:>9.2f} {r.get('perf/rollout_generate_s', float('nan')):>6.2f} "
              f"{r['perf/train_time_s']:>7.2f} {r['perf/weight_sync_time_s']:>6.2f} {r['perf/step_time_s']:>6.2f} "
              f"{r['rollout/reward_mean']:>7.4f} {r['rollout/response_len_mean']:>8.1f} "
              f"{r['rollout/weight_version_lag_mean']:>4.2f} {r['rollout/weight_version_lag_max']:>7.0f}")
    print(f"  mean step after the first: {res['mean_step_after_first_s']}")
    return res


def engine_log_lines(run_dir: Path) -> list[str]:
    lines = []
    for f in sorted((run_dir / "sglang" / "logs").glob("*.log")):
        lines += [f"{f.name}: {line.strip()[:220]}" for line in f.read_text(errors="replace").splitlines()
                  if any(k in line for k in ENGINE_LOG)]
    return lines


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_out/async_sglang")
    ap.add_argument("--rollouts", type=int, default=10, help="rollouts per mode")
    ap.add_argument("--order", default="sync,async", help="modes in the order they run, e.g. sync,async,async,sync")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="start a mode only if the last mode's wall still fits")
    ap.add_argument("--lr", type=float, default=LR, help="train.lr of every mode")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny model, CPU engine flags (checks the path, not speed)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"args": vars(args), "startup": {}, "runs": []}
    save = lambda: (out / "async_sglang.json").write_text(json.dumps(res, indent=2, default=str))  # noqa: E731
    log("start")

    t = time.perf_counter()
    import torch  # noqa: F401 - imported here so the import time counts

    import slime_hydra.app.build as B
    import slime_hydra.app.inputs as I
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.engine import loop  # noqa: F401 - imported here so the import time counts

    res["startup"]["imports_s"] = time.perf_counter() - t
    t = time.perf_counter()
    modes = args.order.split(",")
    cfgs = {m: compose_run(overrides(args.smoke, m, args.rollouts, args.lr)) for m in dict.fromkeys(modes)}
    res["startup"]["compose_validate_s"] = time.perf_counter() - t
    res["overrides"] = {m: overrides(args.smoke, m, args.rollouts, args.lr) for m in cfgs}
    log(f"composed {list(cfgs)}; " + " ".join(res["overrides"][modes[0]]))

    timer = Timer()
    for name in ("build_tokenizer", "load_data", "build_eval_sets", "build_tracker"):  # app/inputs.py: both builders' share
        timer.wrap(I, name)
    for name in ("build_model", "build_trainer", "build_rollout"):
        timer.wrap(B, name)
    run_dir = out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    t = time.perf_counter()
    c = B.build(cfgs[modes[0]], str(run_dir))
    build_s = time.perf_counter() - t
    try:
        engine_s = getattr(c.rollout, "start_time_s", 0.0)
        ph = timer.phases
        res["startup"] |= {
            "build_s": build_s,
            "build_model_s": ph.get("build_model", 0.0),  # random init on the CPU (the .to(device) is in 'other')
            "build_trainer_s": ph.get("build_trainer", 0.0),
            "rollout_engine_and_router_start_s": engine_s,  # server processes to /health, then the router
            "rollout_other_s": ph.get("build_rollout", 0.0) - engine_s,  # save_pretrained for the engine, router check
            "build_other_s": build_s - sum(ph.values()),  # model.to(device), prompt source, ...
            "tokenizer_data_tracker_s": sum(ph.get(k, 0.0) for k in ("build_tokenizer", "load_data", "build_eval_sets", "build_tracker")),
        }
        res["engine_log"] = engine_log_lines(run_dir)
        log(f"built: {json.dumps({k: round(v, 1) for k, v in res['startup'].items()})}")
        for line in res["engine_log"]:
            print("   ", line)
        t = time.perf_counter()
        init_state = {k: v.detach().clone() for k, v in c.trainer.model.state_dict().items()}
        res["startup"]["init_copy_s"] = time.perf_counter() - t
        save()
        for i, mode in enumerate(modes):
            last = res["runs"][-1]["wall_s"] if res["runs"] else 0.0
            if time.perf_counter() - T0 + last * 1.1 > args.deadline_s:
                log(f"{mode} (#{i + 1}): skipped, {args.deadline_s - (time.perf_counter() - T0):.0f} s left")
                continue
            log(f"{mode} (#{i + 1}): start")
            c = fresh_components(cfgs[mode], c, init_state, run_dir)
            res["runs"].append(run_mode(cfgs[mode], c, mode, out, i) | {"order": i})
            save()
    finally:
        c.rollout.shutdown()
    res["summary"] = summarize(res["runs"])
    save()
    print("\n" + json.dumps(res["summary"], indent=2))
    log("done")
    return res


def summarize(runs: list[dict]) -> dict:
    by = {m: [r for r in runs if r["mode"] == m] for m in ("sync", "async")}
    out: dict = {}
    for m, rs in by.items():
        if rs:
            out[m] = {k: statistics.mean(r[k] for r in rs) for k in ("mean_step_after_first_s", "steps_sum_s", "wall_s")
                      if all(r[k] is not None for r in rs)}
            out[m]["rewards"] = [[round(row["rollout/reward_mean"], 4) for row in r["rows"].values()] for r in rs]
    if by["sync"] and by["async"] and "mean_step_after_first_s" in out["sync"] and "mean_step_after_first_s" in out["async"]:
        out["ratio_sync_over_async_mean_step_after_first"] = out["sync"]["mean_step_after_first_s"] / out["async"]["mean_step_after_first_s"]
        out["ratio_sync_over_async_steps_sum"] = out["sync"]["steps_sum_s"] / out["async"]["steps_sum_s"]
    return out


if __name__ == "__main__":
    main()
