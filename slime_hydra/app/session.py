"""One run from a validated config: build, track, loop, report, close; and the Hydra task around it.

Owns what surrounds the loop (output directory, MLflow params/tags/artifacts, summary, the sync or
async loop by train_mode), so the loop itself stays one screen long.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from slime_hydra.app.build import build
from slime_hydra.app.plugins import load_target
from slime_hydra.app.preflight import check_composed
from slime_hydra.app.stop import GracefulStop
from slime_hydra.config.redact import redact_config, redact_override, redact_yaml_file, secrets_in
from slime_hydra.config.schema import RunConfig
from slime_hydra.engine import loop, report
from slime_hydra.engine.checkpoint import resume_hint
from slime_hydra.engine.collect import RolloutPlan
from slime_hydra.engine.warmstart import WarmStart
from slime_hydra.engine.watchdog import StallWatchdog
from slime_hydra.errors import ConfigError, Interrupted
from slime_hydra.tracking import sweep


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}." if not isinstance(v, dict) or v else f"{prefix}{k}"))
            if isinstance(v, dict) and not v:
                out[f"{prefix}{k}"] = "{}"
    else:
        out[prefix.rstrip(".")] = d
    return out


def loop_settings(cfg: RunConfig) -> loop.LoopSettings:
    """The typed values the engine loop reads, its plug-ins (the dynamic-sampling filter, the SFT samples) loaded."""
    r, w, e = cfg.rollout, cfg.warmstart, cfg.eval
    plan = RolloutPlan(r.rollout_batch_size, r.over_sampling_batch_size, load_target(r.dynamic_sampling_filter),
                       r.partial_rollout, r.mask_offpolicy_in_partial_rollout, r.max_dynamic_sampling_rounds,
                       load_target(r.rollout_function), load_target(r.rollout_sample_filter),
                       load_target(r.rollout_all_samples_process))
    warm = WarmStart(w.steps, w.batch_size, w.lr, cfg.seed, load_target(w.custom_sft_samples), w.target_train_accuracy,
                     w.check_prompts, w.check_interval, w.min_steps) if w.steps else None
    return loop.LoopSettings(
        num_rollout=cfg.num_rollout, n_samples_per_prompt=r.n_samples_per_prompt, rollout_plan=plan, warm_start=warm,
        train_async=cfg.train_mode == "async", async_buffer_size=cfg.async_buffer_size,
        async_rollout_timeout_s=cfg.async_rollout_timeout_s, update_weights_interval=cfg.update_weights_interval,
        eval_interval=e.eval_interval, skip_eval_before_train=e.skip_eval_before_train,
        save_eval_samples=e.save_eval_samples, save_interval=cfg.save_interval,
        save_debug_rollout_data=cfg.save_debug_rollout_data, progress_bar=cfg.logger.progress_bar,
        offload_train=bool(cfg.cluster.offload_train), convert_samples=load_target(r.custom_convert_samples_to_train_data),
        rollout_data_postprocess=load_target(r.rollout_data_postprocess))


def watchdog(cfg: RunConfig, c, out: Path, save_dir: str):
    if not cfg.stall_watchdog:
        return contextlib.nullcontext()
    return StallWatchdog(lambda: len(c.state.history), cfg.stall_timeout_factor, cfg.stall_min_timeout_s,
                         out / "stall_stacks.txt", lambda: resume_hint(save_dir), more_stacks=c.more_stacks)


def report_missing(tracker, out: Path) -> None:
    """What the tracker could not log (tracking/retrying.py): printed, and kept in <output_dir>/tracker_missing.txt."""
    if text := tracker.missing_report():
        print(f"warning: {text}", file=sys.stderr, flush=True)
        (out / "tracker_missing.txt").write_text(text + "\n")


def load_counts(cfg: RunConfig, c) -> dict[str, float]:
    """Rows dropped at load, counted once, at step 0 (streamed data counts them per rollout): bad rows with
    data.on_bad_row=skip (data/skipped_rows, eval/<set>/skipped_rows, zeros too), prompts over the length limit
    (data/overlong_rows, eval/<set>/overlong_rows; with skip, or when there are any)."""
    sets = ({} if cfg.data.streaming else {"data": c.train_prompts}) | {f"eval/{n}": s.prompts for n, s in c.eval_sets.items()}
    skip = cfg.data.on_bad_row == "skip"
    out = {f"{k}/overlong_rows": float(n) for k, p in sets.items() if (n := getattr(p, "overlong_rows", 0)) or skip}
    if skip:
        out |= {f"{k}/skipped_rows": float(getattr(p, "skipped_rows", 0)) for k, p in sets.items()}
    return out


def run_session(cfg: RunConfig, output_dir: str, overrides: list[str], parent_run_id: str | None = None) -> dict[str, Any]:
    """Runs and returns the summary (metric -> first/last/max)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    composed = redact_config(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))  # what is written down
    (out / "composed_config.yaml").write_text(OmegaConf.to_yaml(composed))
    meta = {"experiment_name": cfg.experiment_name, "git_sha": git_sha(), "overrides": " ".join(map(redact_override, overrides))}
    (out / "run_info.json").write_text(json.dumps(meta, indent=2))

    save_dir = cfg.save or str(out / "checkpoints")
    built: list = []  # the Components once built: what a hard stop tells the tracker
    with GracefulStop(cfg.stop_grace_s, functools.partial(abandon, built, save_dir)) as stop:
        c = build(cfg, str(out), parent_run_id)
        built.append(c)
        stop.take_signals()  # again: ray.init (cluster.backend=ray) puts its own SIGTERM handler in their place
        return track_and_run(cfg, c, out, save_dir, composed, meta, stop)


def abandon(built: list, save_dir: str, why: str) -> None:
    """A hard stop (app/stop.py): the step in progress is lost; the tracker run is marked KILLED."""
    print(f"stopping now ({why}): the step in progress is abandoned. {resume_hint(save_dir)}", file=sys.stderr, flush=True)
    if built:
        built[0].tracker.close("KILLED")


def track_and_run(cfg: RunConfig, c, out: Path, save_dir: str, composed: dict, meta: dict, stop: GracefulStop) -> dict[str, Any]:
    """The loop between the tracker's opening and its closing; a signal ends it after a checkpoint (Interrupted)."""
    if c.resumed_from is None:
        c.tracker.log_params(flatten(composed))
        if dropped := load_counts(cfg, c):
            c.tracker.log_metrics(dropped, 0)
            c.state.history.append((0, dropped))
    c.tracker.set_tags({"experiment_name": cfg.experiment_name, "git_sha": meta["git_sha"], "overrides": meta["overrides"] or "(none)",
                        "output_dir": str(out)})
    status = "FAILED"
    try:
        with watchdog(cfg, c, out, save_dir):
            history = loop.run(loop_settings(cfg), c, save_dir, stop.requested)
        if stop.requested():
            status = "KILLED"
            raise Interrupted(f"stopped by {stop.name} after the step in progress, its checkpoint written. "
                              f"{resume_hint(save_dir)}", stop.exit_code)
        summary = report.summarize(history)
        print("\n" + report.summary_table(summary), flush=True)
        for path in (out / "composed_config.yaml", report.plot_curves(history, out / "reward_curve.png"),
                     report.write_summary(summary, out / "summary.json")):
            c.tracker.log_artifact(str(path))
        status = "FINISHED"
        return summary
    finally:
        c.tracker.close(status)
        report_missing(c.tracker, out)
        c.rollout.shutdown()


def private(hydra_dir: str) -> None:
    """private_files: what the run creates from here on is its user's only (umask 077: its output directory when it
    is new, checkpoints, the weights, the MLflow store and its artifacts, Ray's temp dir), and so is what Hydra made
    for the run before (the directory, its .hydra/ configs and log), unless that directory is the working directory
    or above it (hydra.run.dir=.), which is not the run's to change."""
    os.umask(0o077)
    d, cwd = Path(hydra_dir).resolve(), Path.cwd().resolve()
    if d.is_dir() and d != cwd and d not in cwd.parents:
        for p in [d, *d.rglob("*")]:
            os.chmod(p, 0o700 if p.is_dir() else 0o600)
def redact_hydra_files(hc, secrets: set[str]) -> None:
    """Hydra saved the job's config and overrides (`.hydra/`, a sweep's multirun.yaml) before the task: masked here."""
    from hydra.types import RunMode

    files = sorted((Path(hc.runtime.output_dir) / hc.output_subdir).glob("*.yaml")) if hc.output_subdir else []
    if hc.mode == RunMode.MULTIRUN:
        files.append(Path(hc.runtime.cwd) / hc.sweep.dir / "multirun.yaml")  # relative to where the sweep was started
    for f in files:
        redact_yaml_file(f, secrets)


def task(cfg: DictConfig) -> float | None:
    """The Hydra task: composed config -> checked -> run. Returns the final eval accuracy (for sweepers).
    Bad input raises UserError, a run that stops on a failure it can name RunError; the CLI prints them."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    redact_hydra_files(hc, secrets_in(OmegaConf.to_container(cfg, resolve=False)))
    typed, problems, notes = check_composed(cfg)
    if problems:
        raise ConfigError(problems)
    output_dir = typed.output_dir or hc.runtime.output_dir
    if typed.private_files:
        private(hc.runtime.output_dir)
    typed = dataclasses.replace(typed, logger=dataclasses.replace(
        typed.logger, tracking_uri=sweep.absolute_tracking_uri(typed.logger.tracking_uri, hc.runtime.cwd)))
    parent = sweep.parent_run_id(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None
    for note in notes:
        print(note, flush=True)
    summary = run_session(typed, output_dir, list(hc.overrides.task), parent)
    accs = [v["last"] for k, v in summary.items() if k.startswith("eval/") and k.endswith("/accuracy")]
    return sum(accs) / len(accs) if accs else summary.get("rollout/reward_mean", {}).get("last")
