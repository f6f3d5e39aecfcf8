"""Derivation: the config a run uses, with every value that follows from others filled in.

`derive(cfg)` returns a new RunConfig and a note for each derivation worth telling; the given config, and every
group of it, stays as it was. It reports no problem: a value that cannot be derived (a batch identity that does not
divide, rows it cannot count) is left unset, and the checks, which read the derived config only, name the key and
the fix. It sits on the composition floor because some rules are a component's (the model implementation that can
run a model, the ranks a step's batch splits over); the rules, slime's where it has them:

- model.model_impl=auto: native where models/native.py runs the model, else transformers (models/checks.py);
- train.global_batch_size / train.num_steps_per_rollout from rollout_batch_size × n_samples_per_prompt (one step when
  neither is set); train.micro_batch_size, when unset, one data-parallel rank's share of a step (one micro-batch);
- num_rollout = num_epoch × prompts // rollout.rollout_batch_size (the jsonl's non-empty lines or the parquet's rows;
  prompts dropped later by data.rollout_max_prompt_len or data.on_bad_row=skip still count);
- rollout.over_sampling_batch_size, when unset: rollout.rollout_batch_size;
- cluster.rollout_num_gpus, when unset and colocated: the actor's GPUs; cluster.offload_train / offload_rollout,
  when unset: cluster.colocate (offload_train: and train_mode=sync);
- debug_train_only: on when load_debug_rollout_data is set (a replay has no engine);
- turned off, with a note: algorithm.grpo_std_normalization with one sample per prompt (a group of one has no std),
  train.skip_zero_advantage_samples when a KL, entropy or custom loss term reads every sample, and
  train.prefix_sharing where packed rows run through transformers' modules (each sample runs its own prompt);
- turned on, with a note: algorithm.use_rollout_logprobs when samples come from older weights (train_mode=async,
  partial rollout, update_weights_interval > 1), so the importance ratio is against the weights that generated each
  token, unless algorithm.use_tis reweights recomputed log-probs instead.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from slime_hydra.config.checks_batch import rollout_samples_text
from slime_hydra.config.datafiles import count_prompts
from slime_hydra.config.schema import AlgorithmConfig, ClusterConfig, RunConfig, TrainConfig
from slime_hydra.models.checks import resolve_model_impl
from slime_hydra.models.size import context_length
from slime_hydra.orchestration.checks import data_parallel_ranks


def derive(cfg: RunConfig) -> tuple[RunConfig, list[str]]:
    """(a new config with the derived values filled in, notes about them)."""
    notes: list[str] = []
    model_impl, note = resolve_model_impl(cfg.model)
    notes += [note] if note else []
    algorithm = derive_algorithm(cfg, notes)
    train = derive_train(cfg, model_impl, notes)
    num_rollout = derive_num_rollout(cfg, notes)
    r = cfg.rollout
    return dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, model_impl=model_impl), algorithm=algorithm, train=train,
        rollout=dataclasses.replace(r, over_sampling_batch_size=pick(r.over_sampling_batch_size, r.rollout_batch_size)),
        cluster=derive_cluster(cfg.cluster, cfg.train_mode == "async"), num_rollout=num_rollout,
        data=dataclasses.replace(cfg.data, rollout_max_prompt_len=derive_max_prompt_len(cfg, notes)),
        debug_train_only=cfg.debug_train_only or bool(cfg.load_debug_rollout_data)), notes


def pick(value, default):
    return default if value is None else value


def derive_algorithm(cfg: RunConfig, notes: list[str]) -> AlgorithmConfig:
    a, changes = cfg.algorithm, {}
    if cfg.rollout.n_samples_per_prompt == 1 and a.grpo_std_normalization:  # slime: warn and turn it off
        changes["grpo_std_normalization"] = False
        notes.append("algorithm.grpo_std_normalization turned off: a group of rollout.n_samples_per_prompt=1 has no std")
    if cfg.train_mode == "async" or cfg.rollout.partial_rollout or cfg.update_weights_interval > 1:
        if not (a.use_rollout_logprobs or a.use_tis):
            changes["use_rollout_logprobs"] = True
            why = "train_mode=async" if cfg.train_mode == "async" else (
                "rollout.partial_rollout=true" if cfg.rollout.partial_rollout else f"update_weights_interval={cfg.update_weights_interval}")
            notes.append(f"algorithm.use_rollout_logprobs turned on: with {why} samples come from older weights, and the "
                         "importance ratio must use the log-probs of the weights that generated them (or set algorithm.use_tis=true "
                         "to reweight recomputed ones)")
    return dataclasses.replace(a, **changes)


def derive_train(cfg: RunConfig, model_impl: str, notes: list[str]) -> TrainConfig:
    t, a = cfg.train, cfg.algorithm
    changes = derive_batch(cfg, notes)
    if t.skip_zero_advantage_samples and (a.use_kl_loss or a.entropy_coef != 0 or a.custom_loss or a.loss_type == "sft_loss"):
        changes["skip_zero_advantage_samples"] = False
        notes.append("train.skip_zero_advantage_samples turned off: the KL/entropy/custom/SFT loss terms depend on every sample")
    if t.qkv_format == "thd" and t.backend != "megatron" and model_impl == "transformers" and t.prefix_sharing:
        changes["prefix_sharing"] = False
        notes.append("train.prefix_sharing turned off: with train.qkv_format=thd each sample runs its own prompt in the packed "
                     "row (model.model_impl=native packs and shares prompts)")
    return dataclasses.replace(t, **changes)


def derive_batch(cfg: RunConfig, notes: list[str]) -> dict:
    """global_batch_size, num_steps_per_rollout and micro_batch_size, where the identity divides (else nothing)."""
    t = cfg.train
    total, lhs = rollout_samples_text(cfg.rollout)
    gbs, steps = t.global_batch_size, t.num_steps_per_rollout
    if gbs is None and steps is None:
        steps = 1
    if gbs is None and steps >= 1 and total % steps == 0:
        gbs = total // steps
    elif steps is None and gbs >= 1 and total % gbs == 0:
        steps = total // gbs
    if gbs is None or steps is None or gbs * steps != total:
        return {}  # config/checks_batch.py names the fix
    micro = t.micro_batch_size
    if micro is None:  # one micro-batch per step: a rank's share of the global batch
        micro = max(gbs // data_parallel_ranks(cfg.cluster, t.backend, cfg.parallelism)[0], 1)
    notes.append(f"batch: {lhs} = train.global_batch_size × train.num_steps_per_rollout = {gbs} × {steps}"
                 f" (train.micro_batch_size={micro})")
    return {"global_batch_size": gbs, "num_steps_per_rollout": steps, "micro_batch_size": micro}


def derive_num_rollout(cfg: RunConfig, notes: list[str]) -> Optional[int]:
    r = cfg.rollout
    if cfg.num_rollout is not None or cfg.num_epoch is None or cfg.num_epoch < 1 or not cfg.data.prompt_data \
            or r.rollout_batch_size < 1:
        return cfg.num_rollout
    n, _ = count_prompts(cfg.data.prompt_data, f"num_epoch={cfg.num_epoch}")  # (the checks name why not)
    if n is None:
        return None
    num_rollout = cfg.num_epoch * n // r.rollout_batch_size
    notes.append(f"num_rollout = num_epoch × prompts // rollout.rollout_batch_size = {cfg.num_epoch} × {n} // "
                 f"{r.rollout_batch_size} = {num_rollout}")
    return num_rollout


def model_context(cfg: RunConfig) -> tuple[Optional[int], str]:
    """(the longest sequence a rollout runs, in tokens; where that comes from): rollout.sglang.context_length when the
    SGLang engines are given one, else the model's (models/size.py)."""
    r = cfg.rollout
    if r.backend == "sglang" and r.sglang.get("context_length"):
        return int(r.sglang["context_length"]), "rollout.sglang.context_length"
    return context_length(cfg.model)


def derive_max_prompt_len(cfg: RunConfig, notes: list[str]) -> Optional[int]:
    d, response = cfg.data, cfg.rollout.rollout_max_response_len
    context, source = model_context(cfg)
    if d.rollout_max_prompt_len is not None or context is None or context - response < 1:
        return d.rollout_max_prompt_len  # (no room at all: app/checks.py names it)
    notes.append(f"data.rollout_max_prompt_len={context - response}: the model's context {context} ({source}) - "
                 f"rollout.rollout_max_response_len={response}; longer prompts are dropped and counted in data/overlong_rows")
    return context - response


def derive_cluster(c: ClusterConfig, train_async: bool) -> ClusterConfig:
    actor = c.actor_num_nodes * c.actor_num_gpus_per_node
    return dataclasses.replace(
        c, rollout_num_gpus=actor if c.rollout_num_gpus is None and c.colocate else c.rollout_num_gpus,
        # offload_train: never by default under train_mode=async, which trains while the engines generate
        offload_train=pick(c.offload_train, c.colocate and not train_async), offload_rollout=pick(c.offload_rollout, c.colocate))
