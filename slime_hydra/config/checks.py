"""The checks of a typed RunConfig that need the config alone: ranges, keys that depend on each other, batch
arithmetic, files that must exist.

`check(cfg)` reads the config that `derive` (app/derive.py) returned and writes nothing: it returns every problem
found (each naming the key and the fix) and notes. It touches no model, GPU or cluster: only the file system (do data
files exist) and imports of `_target_` plug-ins. Rules that belong to one backend (a trainer, a rollout engine,
a cluster backend) or to the model implementation live beside it, and the composition floor (app/checks.py) calls
them with the groups they read; no rule here names a backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from slime_hydra.config.checks_algorithm import check_algorithm
from slime_hydra.config.checks_batch import check_batch, check_microbatch
from slime_hydra.config.checks_buffer import check_buffer, check_num_epoch
from slime_hydra.config.checks_data import check_data
from slime_hydra.config.checks_debug import check_debug
from slime_hydra.config.checks_hooks import check_step_hooks
from slime_hydra.config.choices import CHOICES
from slime_hydra.config.plugins import check_target
from slime_hydra.config.schema import RunConfig
from slime_hydra.errors import Missing


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check(cfg: RunConfig, given_num_rollout: Optional[int]) -> tuple[list[str], list[str]]:
    """(every problem, notes) of the derived `cfg`. `given_num_rollout` is num_rollout as the user gave it: derivation
    fills it from num_epoch, so only the given value says whether both were set."""
    problems: list[str] = []
    notes: list[str] = []
    check_values(cfg, problems)
    check_algorithm(cfg, problems)
    check_batch(cfg, problems)
    check_microbatch(cfg, problems, notes)
    check_num_epoch(cfg, given_num_rollout, problems)
    check_run(cfg, problems)
    check_debug(cfg, problems, notes)
    check_buffer(cfg, problems)
    check_data(cfg, problems)
    check_target("reward.custom_rm", cfg.reward.custom_rm, 1, problems)
    check_step_hooks(cfg, problems)
    check_agent(cfg, problems)
    check_stall_watchdog(cfg, problems)
    check_cluster(cfg, problems)
    return problems, notes


def check_values(cfg: RunConfig, problems: list[str]) -> None:
    for key, allowed in CHOICES.items():
        value = _get(cfg, key)
        if value not in allowed:
            problems.append(f"{key}={value!r} is not one of {list(allowed)}")
    metric = cfg.logger.sweep_rank_metric  # which jobs report it is known only when the sweep ends; its form now
    if metric is not None and (metric.startswith("/") or metric.endswith("/") or "/" not in metric):
        problems.append(f"logger.sweep_rank_metric={metric!r} is not a metric name (section/name, e.g. eval/addition/accuracy "
                        "or rollout/reward_mean); set one, or null for the first eval/<set>/accuracy the jobs report")
    r, a, t = cfg.rollout, cfg.algorithm, cfg.train
    if r.rollout_temperature <= 0:
        problems.append(f"rollout.rollout_temperature={r.rollout_temperature} must be > 0; use rollout.rollout_top_k=1 for greedy decoding")
    if not 0 < r.rollout_top_p <= 1:
        problems.append(f"rollout.rollout_top_p={r.rollout_top_p} must be in (0, 1]")
    if r.rollout_top_k != -1 and r.rollout_top_k < 1:
        problems.append(f"rollout.rollout_top_k={r.rollout_top_k} must be -1 (off) or >= 1")
    for key in ("rollout.rollout_max_response_len", "rollout.rollout_batch_size", "rollout.n_samples_per_prompt",
                "rollout.generation_batch_size", "cluster.rollout_num_gpus_per_engine"):
        if _get(cfg, key) < 1:
            problems.append(f"{key}={_get(cfg, key)} must be >= 1")
    if a.eps_clip <= 0 or (a.eps_clip_high is not None and a.eps_clip_high <= 0):
        problems.append("algorithm.eps_clip and algorithm.eps_clip_high must be > 0")
    if a.eps_clip_c is not None and a.eps_clip_c <= 1:
        problems.append(f"algorithm.eps_clip_c={a.eps_clip_c} must be > 1 (dual-clip lower bound)")
    if a.kl_loss_coef != 0 and not a.use_kl_loss:
        problems.append(f"algorithm.kl_loss_coef={a.kl_loss_coef} has no effect without algorithm.use_kl_loss=true; set it or set algorithm.kl_loss_coef=0")
    if t.lr <= 0:
        problems.append(f"train.lr={t.lr} must be > 0")
    if t.min_lr < 0 or (t.lr_decay_style != "constant" and t.min_lr > t.lr):
        problems.append(f"train.min_lr={t.min_lr} must be in [0, train.lr={t.lr}]: the {t.lr_decay_style} schedule goes from "
                        "train.lr to train.min_lr, so a higher floor raises the rate as it 'decays'; lower train.min_lr "
                        "(slime's default 0) or raise train.lr")


def check_run(cfg: RunConfig, problems: list[str]) -> None:
    if cfg.num_rollout is None or cfg.num_rollout < 1:
        problems.append(f"num_rollout={cfg.num_rollout} must be set to the number of rollouts (>= 1), e.g. num_rollout=100")
    for key in ("save_interval", "eval.eval_interval"):
        v = _get(cfg, key)
        if v is not None and v < 1:
            problems.append(f"{key}={v} must be >= 1 or null")
    w = cfg.warmstart
    if w.steps < 0:
        problems.append(f"warmstart.steps={w.steps} must be >= 0")
    if w.target_train_accuracy is not None and not 0 < w.target_train_accuracy <= 1:
        problems.append(f"warmstart.target_train_accuracy={w.target_train_accuracy} must be in (0, 1], or null to "
                        "always take warmstart.steps")
    if w.steps > 0 and w.min_steps:  # steps=0: no warm start, so nothing below applies
        if w.target_train_accuracy is None:
            problems.append(f"warmstart.min_steps={w.min_steps} only delays the target's checks, and "
                            "warmstart.target_train_accuracy is null; set a target or warmstart.min_steps=0")
        elif not 0 <= w.min_steps <= w.steps:
            problems.append(f"warmstart.min_steps={w.min_steps} must be in [0, warmstart.steps={w.steps}] (the cap); "
                            "lower it or raise warmstart.steps")
    for key in ("check_interval", "check_prompts"):
        if getattr(w, key) < 1:
            problems.append(f"warmstart.{key}={getattr(w, key)} must be >= 1")
    if cfg.load is not None and not Path(cfg.load).exists():
        problems.append(Missing(f"load={cfg.load}: no such checkpoint directory; point load at a directory written by save",
                                "load", cfg.load))


def check_agent(cfg: RunConfig, problems: list[str]) -> None:
    """The agent keys around the generate hook (whose own check, agent/hook.py, app/checks.py calls); the SFT samples hook."""
    if cfg.rollout.max_turns < 1:
        problems.append(f"rollout.max_turns={cfg.rollout.max_turns} must be >= 1")
    if cfg.data.tool_key and not cfg.data.apply_chat_template:
        problems.append(f"data.tool_key={cfg.data.tool_key} reaches the model only through the chat template; "
                        "set data.apply_chat_template=true or data.tool_key=null")
    check_target("warmstart.custom_sft_samples", cfg.warmstart.custom_sft_samples, 2, problems)


def check_stall_watchdog(cfg: RunConfig, problems: list[str]) -> None:
    for key in ("stall_timeout_factor", "stall_min_timeout_s"):
        if getattr(cfg, key) <= 0:
            problems.append(f"{key}={getattr(cfg, key)} must be > 0; stall_watchdog=false switches the watchdog off")
    if cfg.stop_grace_s <= 0:
        problems.append(f"stop_grace_s={cfg.stop_grace_s} must be > 0 (seconds from a SIGTERM to the run's exit)")


def check_cluster(cfg: RunConfig, problems: list[str]) -> None:
    """The resource keys' ranges. What each cluster backend can place is checked beside it (orchestration/checks.py);
    what a cluster holds, when the run's orchestration starts, before any actor is built."""
    c = cfg.cluster
    for key in ("actor_num_nodes", "actor_num_gpus_per_node"):
        if getattr(c, key) < 1:
            problems.append(f"cluster.{key}={getattr(c, key)} must be >= 1")
    if c.rollout_num_gpus is None:  # derived from the actor's GPUs when colocated
        problems.append("cluster.rollout_num_gpus is not set and cluster.colocate=false; set cluster.rollout_num_gpus "
                        "(the GPUs of the rollout engines) or cluster.colocate=true")
        return
    per = c.rollout_num_gpus_per_engine
    if c.rollout_num_gpus < 1:
        problems.append(f"cluster.rollout_num_gpus={c.rollout_num_gpus} must be >= 1")
    elif per >= 1 and c.rollout_num_gpus % per:
        problems.append(f"cluster.rollout_num_gpus={c.rollout_num_gpus} is not divisible by cluster.rollout_num_gpus_per_engine={per}; "
                        f"set cluster.rollout_num_gpus to a multiple of {per} or cluster.rollout_num_gpus_per_engine to a divisor of it")
    for key in ("placement_timeout_s", "ray_call_timeout_s", "distributed_timeout_s"):
        if getattr(c, key) <= 0:
            problems.append(f"cluster.{key}={getattr(c, key)} must be > 0 (seconds)")
