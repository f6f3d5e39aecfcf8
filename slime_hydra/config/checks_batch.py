"""Checks of the batch arithmetic (rollout_batch_size × n_samples_per_prompt = global_batch_size ×
num_steps_per_rollout, and the micro-batch that divides a step), of token-budget micro-batches
(train.use_dynamic_batch_size, training/microbatch.py) and of packed micro-batches' keys (train.qkv_format).

What one trainer cannot run (a pipeline with a token budget, a packed path's layouts) is checked beside that
trainer, by its own checks module.
"""

from __future__ import annotations

from slime_hydra.config.schema import RolloutConfig, RunConfig


def rollout_samples_text(r: RolloutConfig) -> tuple[int, str]:
    """(samples per rollout, the identity's left side as the messages spell it)."""
    total = r.rollout_batch_size * r.n_samples_per_prompt
    return total, (f"rollout.rollout_batch_size × rollout.n_samples_per_prompt = {r.rollout_batch_size} × "
                   f"{r.n_samples_per_prompt} = {total}")


def check_batch(cfg: RunConfig, problems: list[str]) -> None:
    """rollout_batch_size × n_samples_per_prompt = global_batch_size × num_steps_per_rollout, on the derived config:
    a size still unset there is one that derivation could not divide out."""
    t = cfg.train
    total, lhs = rollout_samples_text(cfg.rollout)
    gbs, steps = t.global_batch_size, t.num_steps_per_rollout
    if gbs is None:
        problems.append(f"{lhs} is not divisible by train.num_steps_per_rollout={steps}; set train.num_steps_per_rollout to a divisor of {total}")
    elif steps is None:
        problems.append(f"{lhs} is not divisible by train.global_batch_size={gbs}; set train.global_batch_size to a divisor of {total}")
    elif gbs * steps != total:
        fix = f"set train.global_batch_size={total // steps}" if total % steps == 0 else ""
        fix2 = f"train.num_steps_per_rollout={total // gbs}" if total % gbs == 0 else ""
        fixes = " or ".join(x for x in (fix, fix2) if x) or "change the batch sizes"
        problems.append(f"{lhs} must equal train.global_batch_size × train.num_steps_per_rollout = {gbs} × {steps}; {fixes}")
    elif t.micro_batch_size < 1 or gbs % t.micro_batch_size:
        problems.append(f"train.micro_batch_size={t.micro_batch_size} must divide train.global_batch_size={gbs}; set train.micro_batch_size to a divisor of {gbs}")


def check_microbatch(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    t = cfg.train
    for key in ("max_tokens_per_gpu", "log_probs_max_tokens_per_gpu"):
        v = getattr(t, key)
        if v is not None and v < 1:
            problems.append(f"train.{key}={v} must be >= 1 (tokens per micro-batch on one GPU) or null")
    if not t.use_dynamic_batch_size:
        if t.max_tokens_per_gpu is not None or t.log_probs_max_tokens_per_gpu is not None:
            notes.append("train.max_tokens_per_gpu / log_probs_max_tokens_per_gpu apply only with train.use_dynamic_batch_size=true; "
                         "micro-batches hold train.micro_batch_size samples")
        return
    if t.max_tokens_per_gpu is None:
        problems.append("train.use_dynamic_batch_size=true needs train.max_tokens_per_gpu (a micro-batch's token budget on "
                        "one GPU, e.g. train.max_tokens_per_gpu=4096); set it, or train.use_dynamic_batch_size=false")
    budget = t.max_tokens_per_gpu
    longest = cfg.rollout.rollout_max_response_len + (cfg.data.rollout_max_prompt_len or 0)
    if budget is not None and budget >= 1 and cfg.data.rollout_max_prompt_len and budget < longest:
        notes.append(f"train.max_tokens_per_gpu={budget} < data.rollout_max_prompt_len + rollout.rollout_max_response_len = "
                     f"{longest}: a sample longer than the budget trains alone in its own micro-batch")
