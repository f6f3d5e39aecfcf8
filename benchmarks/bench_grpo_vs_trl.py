"""Embedded slime_hydra GRPO default vs TRL's GRPOTrainer: wall time per step and held-out accuracy.

Per seed, both contestants start from one SFT-warm-started checkpoint (slime_hydra's own warm start
with that seed, stopped at greedy training accuracy 0.3, saved with `save_pretrained`) and train for the same number of steps on the same tiny
Qwen3, the same addition prompts (raw strings, no chat template), the same `math_reward`, 32 prompts x 8
samples per step, at most 6 new tokens (eos stops), temperature 1, the experiment's lr held constant (TRL
has no cosine-to-min_lr schedule of the same shape), AdamW with the same betas/eps, grad clip 1, PPO clip
0.2, no KL, per-sequence token-mean loss, one optimizer step per rollout, all on CPU with 2 threads. Every
TRL setting is derived from the composed slime_hydra config, so the two read one source of truth.

Measured: the median wall seconds per step over every step of every seed (slime_hydra's steps of a seed in
two halves, before and after TRL's run, so that a drift in the machine's speed weighs on both alike); their
ratio is the speedup. For slime_hydra a step is `perf/step_time_s` (generate + reward + train + weight
sync); for TRL it is on_step_begin -> on_step_end of its Trainer (generate + reward + train + optimizer
step). Final models are scored by the same code: slime_hydra's greedy `evaluate` over a `LocalRollout` of
the trained model (200 held-out prompts); accuracy is compared paired by seed (same warm start), as a mean
difference with its standard error, because one seed's difference after 100 steps is mostly noise.

Left out: logging, checkpoint saving and eval time (outside both step timers); GPUs, vLLM/SGLang,
multiple processes. The two are not bit-identical algorithms: slime_hydra skips the backward pass for
zero-advantage samples (which contribute no gradient; so its steps are cheaper when few groups have mixed
rewards), uses its own sampler and shuffling, and keeps a separate rollout copy of the weights; TRL
samples with `model.generate`.

Run: HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.bench_grpo_vs_trl   (8 seeds x 100 steps, ~10 minutes)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

NUM_THREADS = 2
BASE_OVERRIDES = ["logger=none", "logger.progress_bar=false", "train.lr_decay_style=constant"]
EVAL_SET = "addition"
NAMES = ("slime_hydra", "trl")
# Every seed's warm start stops at this greedy training accuracy, so that RL has work to do in every seed (300 fixed
# SFT steps land anywhere from 0.045 to 0.6 held-out across seeds; below ~0.15 neither contestant learns in 100 steps)
WARMSTART_TARGET = 0.3
TRL_LOSS_TYPES = {"sample_token_mean": "grpo", "token_mean": "dapo", "seq_mean_token_sum_norm": "dr_grpo"}


def compose(extra: list[str], seed: int | None = None):
    """The bench's composed config; `seed` overrides the experiment's."""
    from slime_hydra.app.preflight import compose_run

    return compose_run(BASE_OVERRIDES + ([] if seed is None else [f"seed={seed}"]) + extra)


def warm_started_checkpoint(path: Path, seed: int | None = None, target: float | None = None) -> str:
    """The default experiment's SFT warm start (slime_hydra's `prepare`), saved as an HF checkpoint; with `target`,
    it stops at the first check that reaches that greedy training accuracy (warmstart.target_train_accuracy, at
    most 1000 steps, no floor: the protocol the quoted bench figures were measured with)."""
    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine.loop import prepare

    landing = [] if target is None else ["warmstart.steps=1000", f"warmstart.target_train_accuracy={target}",
                                         "warmstart.min_steps=0"]
    cfg = compose(["eval=none", *landing], seed)
    c = build(cfg, str(path / "warmstart_run"))
    prepare(loop_settings(cfg), c)
    c.trainer.save_hf(str(path / "ckpt"), c.tokenizer)
    c.tracker.close("FINISHED")
    return str(path / "ckpt")


def heldout_accuracy(model: torch.nn.Module, ckpt: str) -> float:
    """Greedy held-out accuracy through slime_hydra's own eval path (identical for every model)."""
    from slime_hydra.app.inputs import build_eval_sets
    from slime_hydra.engine.steps import evaluate, rollout_sampling
    from slime_hydra.models.build import build_tokenizer
    from slime_hydra.rollout.local import LocalRollout

    cfg = compose([f"model.hf_checkpoint={ckpt}"])
    tok = build_tokenizer(cfg.model)
    eval_sets = build_eval_sets(cfg, tok, rollout_sampling(cfg.rollout, (tok.eos_token_id,)))
    rollout = LocalRollout(model, tok, seed=cfg.seed, generation_batch_size=cfg.rollout.generation_batch_size)
    metrics, _ = evaluate(rollout, eval_sets, step=0)
    return metrics[f"eval/{EVAL_SET}/accuracy"]


def load_checkpoint(ckpt: str, seed: int | None = None):
    from slime_hydra.models.build import build_model, build_tokenizer

    cfg = compose([f"model.hf_checkpoint={ckpt}"], seed)
    tok = build_tokenizer(cfg.model)
    return build_model(cfg.model, tok, cfg.seed), tok, cfg


def run_slime_hydra(ckpt: str, steps: int, out_dir: Path, seed: int | None = None, between=None) -> dict:
    """build + run (not run_session: its summary drops the per-step values a median needs). With `between`, the
    steps run in two halves around it (the engine continues from `start_rollout`, as after a resume)."""
    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine.loop import run

    cfg = compose([f"model.hf_checkpoint={ckpt}", "warmstart.steps=0", f"num_rollout={steps}", "eval=none"], seed)
    assert cfg.warmstart.steps == 0, cfg.warmstart
    c = build(cfg, str(out_dir))
    cpu_s = 0.0
    try:
        for first, last in ((0, steps // 2), (steps // 2, steps)) if between else ((0, steps),):
            if first:
                between()
            c.state.start_rollout = first
            cpu0 = time.process_time()
            history = run(dataclasses.replace(loop_settings(cfg), num_rollout=last), c, str(out_dir / "checkpoints"))
            cpu_s += time.process_time() - cpu0
    finally:
        c.tracker.close("FINISHED")
        c.rollout.shutdown()
    per_step = [m for _, m in history if "perf/step_time_s" in m]
    assert len(per_step) == steps, len(per_step)
    return {"step_times_s": [m["perf/step_time_s"] for m in per_step], "train_cpu_s": cpu_s,
            "train_reward_mean": [m["rollout/reward_mean"] for m in per_step], "model": c.trainer.model}


class StepTimer:
    """Wall seconds from on_step_begin to on_step_end of each optimizer step."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self
        self.times: list[float] = []

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                timer._t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                timer.times.append(time.perf_counter() - timer._t0)

        self.callback = _Callback()


def trl_args(cfg, steps: int, out_dir: Path):
    """GRPOConfig mirroring the composed slime_hydra config (one generation batch = one optimizer step)."""
    from trl import GRPOConfig

    r, a, t = cfg.rollout, cfg.algorithm, cfg.train
    assert t.num_steps_per_rollout == 1 and t.lr_decay_style == "constant" and not a.entropy_coef
    return GRPOConfig(
        output_dir=str(out_dir), max_steps=steps, seed=cfg.seed,
        per_device_train_batch_size=r.rollout_batch_size * r.n_samples_per_prompt,  # completions, not prompts
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        num_generations=r.n_samples_per_prompt, max_completion_length=r.rollout_max_response_len,
        temperature=r.rollout_temperature, top_p=r.rollout_top_p, top_k=max(r.rollout_top_k, 0),
        learning_rate=t.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=t.weight_decay,
        adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2, adam_epsilon=t.adam_eps, max_grad_norm=t.clip_grad,
        beta=a.kl_loss_coef if a.use_kl_loss else 0.0, epsilon=a.eps_clip, epsilon_high=a.eps_clip_high,
        loss_type=TRL_LOSS_TYPES[a.loss_aggregation],  # KeyError: no TRL equivalent for that aggregation
        scale_rewards="group" if a.grpo_std_normalization else "none",
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        report_to=[], eval_strategy="no", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        log_level="error", dataloader_num_workers=0,
    )


def run_trl(ckpt: str, steps: int, out_dir: Path, seed: int | None = None) -> dict:
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from slime_hydra.app.inputs import load_data
    from slime_hydra.rewards.verifiers import math_reward

    model, tok, cfg = load_checkpoint(ckpt, seed)
    train = load_data(cfg, tok)
    dataset = Dataset.from_list([{"prompt": p.text, "label": p.label} for p in train])  # raw strings: no chat template
    batch_rewards: list[float] = []

    def addition_reward(completions, label, **_):
        rewards = [math_reward(c, y) for c, y in zip(completions, label)]
        batch_rewards.append(sum(rewards) / len(rewards))
        return rewards

    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=addition_reward, args=trl_args(cfg, steps, out_dir),
                          train_dataset=dataset, processing_class=tok, callbacks=[timer.callback])
    trainer.remove_callback(PrinterCallback)  # the end-of-training metrics dict
    torch.set_num_threads(NUM_THREADS)
    cpu0 = time.process_time()
    trainer.train()
    return {"step_times_s": timer.times, "train_cpu_s": time.process_time() - cpu0, "train_reward_mean": batch_rewards,
            "model": trainer.accelerator.unwrap_model(trainer.model)}


def finish(result: dict, ckpt: str) -> dict:
    model = result.pop("model")
    tail = result["train_reward_mean"][-10:]
    return result | {"median_step_time_s": statistics.median(result["step_times_s"]),
                     "cpu_s_per_step": result["train_cpu_s"] / len(result["step_times_s"]),
                     "load_avg_1min_after": os.getloadavg()[0],
                     "train_reward_last10": sum(tail) / max(len(tail), 1),
                     "heldout_accuracy": heldout_accuracy(model, ckpt)}


def bench_seed(seed: int, steps: int, tmp: Path) -> dict:
    """One warm start (its own seed), then both contestants' `steps` from it; slime_hydra's in two halves."""
    t0 = time.perf_counter()
    ckpt = warm_started_checkpoint(tmp, seed, WARMSTART_TARGET)
    start_acc = heldout_accuracy(load_checkpoint(ckpt, seed)[0], ckpt)
    print(f"seed {seed}: warm start done in {time.perf_counter() - t0:.1f}s; start accuracy {start_acc:.3f}", flush=True)
    res = {"seed": seed, "start_accuracy": start_acc}

    def trl_between():
        t1 = time.perf_counter()
        res["trl"] = finish(run_trl(ckpt, steps, tmp / "trl", seed), ckpt)
        print(f"seed {seed}: trl {steps} steps in {time.perf_counter() - t1:.1f}s", flush=True)

    t0 = time.perf_counter()
    res["slime_hydra"] = finish(run_slime_hydra(ckpt, steps, tmp / "slime_hydra", seed, between=trl_between), ckpt)
    print(f"seed {seed}: slime_hydra {steps} steps (two halves around TRL's) done {time.perf_counter() - t0:.1f}s "
          "after they began", flush=True)
    res["speedup_vs_trl"] = res["trl"]["median_step_time_s"] / res["slime_hydra"]["median_step_time_s"]
    return res


def summarize(runs: list[dict]) -> dict:
    """Over seeds: the median of every step of every seed per contestant (their ratio is the speedup), mean held-out
    accuracy per contestant, and the paired difference (slime_hydra - TRL, same warm start) with its standard error."""
    out = {}
    for name in NAMES:
        steps_s = [t for r in runs for t in r[name]["step_times_s"]]
        out[name] = {"median_step_time_s": statistics.median(steps_s),
                     "heldout_accuracy_mean": statistics.fmean(r[name]["heldout_accuracy"] for r in runs)}
    diffs = [r["slime_hydra"]["heldout_accuracy"] - r["trl"]["heldout_accuracy"] for r in runs]
    out["heldout_accuracy_diff_mean"] = statistics.fmean(diffs)
    out["heldout_accuracy_diff_se"] = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    out["start_accuracy_mean"] = statistics.fmean(r["start_accuracy"] for r in runs)
    out["speedup_vs_trl"] = out["trl"]["median_step_time_s"] / out["slime_hydra"]["median_step_time_s"]
    return out


def table(runs: list[dict], summary: dict) -> str:
    head = f"{'seed':>6}{'start':>8}{'s/step slime_hydra':>20}{'s/step TRL':>12}{'speedup':>9}"
    head += f"{'held-out slime_hydra':>22}{'held-out TRL':>14}{'train reward (last 10) s_h/TRL':>33}"
    lines = [head, "-" * len(head)]
    for r in runs:
        s, t = r["slime_hydra"], r["trl"]
        lines.append(f"{r['seed']:>6}{r['start_accuracy']:>8.3f}{s['median_step_time_s']:>20.3f}"
                     f"{t['median_step_time_s']:>12.3f}{r['speedup_vs_trl']:>8.2f}x{s['heldout_accuracy']:>22.3f}"
                     f"{t['heldout_accuracy']:>14.3f}{s['train_reward_last10']:>23.3f} / {t['train_reward_last10']:.3f}")
    s, t = summary["slime_hydra"], summary["trl"]
    lines.append("-" * len(head))
    lines.append(f"{'all':>6}{summary['start_accuracy_mean']:>8.3f}{s['median_step_time_s']:>20.3f}"
                 f"{t['median_step_time_s']:>12.3f}{summary['speedup_vs_trl']:>8.2f}x"
                 f"{s['heldout_accuracy_mean']:>22.3f}{t['heldout_accuracy_mean']:>14.3f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps (= rollouts) per contestant per seed")
    ap.add_argument("--out", default="bench_out/grpo_vs_trl.json", help="where to write the results as JSON")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="one run per seed (its own warm start, sampling and TRL seed); default: the experiment's seed "
                    "and the next seven")
    args = ap.parse_args()
    seeds = args.seeds or [compose([]).seed + k for k in range(8)]
    torch.set_num_threads(NUM_THREADS)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    runs = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="bench_grpo_") as tmp:
            runs.append(bench_seed(seed, args.steps, Path(tmp)))
    summary = summarize(runs)
    print("\n" + table(runs, summary))
    print(f"\n{args.steps} steps per contestant per seed, {len(runs)} seeds; both start from each seed's warm start "
          f"(stopped at greedy training accuracy {WARMSTART_TARGET})")
    print(f"held-out accuracy, slime_hydra - TRL (paired by seed): {summary['heldout_accuracy_diff_mean']:+.3f} "
          f"(standard error {summary['heldout_accuracy_diff_se']:.3f})")
    print(f"speedup vs TRL: {summary['speedup_vs_trl']:.2f}x")
    load = max(r[n]["load_avg_1min_after"] for r in runs for n in NAMES)
    if load > NUM_THREADS + 0.5:  # wall times count other processes' CPU use too
        print(f"warning: 1-min load average reached {load:.1f} on {NUM_THREADS} threads; other processes shared the "
              "CPU, so wall times are unreliable (CPU s/step is less affected)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "num_threads": NUM_THREADS, "runs": runs, "summary": summary},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
