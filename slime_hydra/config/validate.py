"""Semantic validation and derivations over the typed RunConfig: the config alone.

`check(cfg)` returns the config with derived values filled in, every problem found (each naming the
key and the fix) and notes about derivations. It touches no model, GPU or Ray: only the file system
(do data files exist) and imports of `_target_` plug-ins. The checks each component owns (megatron,
SGLang, the generate hook, rewards) live beside the component; app/checks.py runs this, then those.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from slime_hydra.config.plugins import check_target
from slime_hydra.config.schema import EvalDatasetConfig, RunConfig
from slime_hydra.config.validate_algorithm import check_algorithm
from slime_hydra.config.validate_buffer import check_buffer, derive_num_rollout
from slime_hydra.config.validate_data import check_prompt_data, check_streaming
from slime_hydra.config.validate_debug import check_debug
from slime_hydra.config.validate_microbatch import check_microbatch
from slime_hydra.config.validate_model import check_model_training
from slime_hydra.config.validate_ray import check_ray_pairing
from slime_hydra.errors import Missing

# algorithm.advantage_estimator is not here: its names are the rows of algorithms/estimators.py, a floor above,
# and algorithms/checks.py checks it (app/checks.py calls it).
CHOICES: dict[str, tuple[str, ...]] = {
    "algorithm.loss_type": ("policy_loss", "sft_loss"),
    "algorithm.kl_loss_type": ("k1", "k2", "k3", "low_var_kl"),
    "algorithm.loss_aggregation": ("sample_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"),
    "rollout.backend": ("local", "sglang"),
    "train.backend": ("torch", "megatron"),
    "train.lr_decay_style": ("constant", "linear", "cosine"),
    "train.adam_impl": ("fused", "foreach", "for_loop"),
    "train.qkv_format": ("bshd", "thd"),
    "logger.tracker": ("mlflow", "tensorboard", "none"),
    "logger.sweep_rank_direction": ("max", "min"),
    "model.dtype": ("float32", "bfloat16", "float16", "float64"),  # float64: exactness tests on CPU
    "model.attn_implementation": ("sdpa", "eager"),
    "model.model_impl": ("transformers", "native", "auto"),
    "reward.rm_on_failure": ("zero", "raise"),
    "data.on_bad_row": ("error", "skip"),
    "cluster.device": ("auto", "cpu", "cuda"),
    "model.tokenizer": ("char", "char_tools"),
    "cluster.backend": ("local", "ray"),
}


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_batch(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    """rollout_batch_size × n_samples_per_prompt = global_batch_size × num_steps_per_rollout."""
    r, t = cfg.rollout, cfg.train
    total = r.rollout_batch_size * r.n_samples_per_prompt
    lhs = f"rollout.rollout_batch_size × rollout.n_samples_per_prompt = {r.rollout_batch_size} × {r.n_samples_per_prompt} = {total}"
    gbs, steps = t.global_batch_size, t.num_steps_per_rollout
    if gbs is None and steps is None:
        steps = 1
    if gbs is None:
        if steps < 1 or total % steps:
            problems.append(f"{lhs} is not divisible by train.num_steps_per_rollout={steps}; set train.num_steps_per_rollout to a divisor of {total}")
            return
        gbs = total // steps
    elif steps is None:
        if gbs < 1 or total % gbs:
            problems.append(f"{lhs} is not divisible by train.global_batch_size={gbs}; set train.global_batch_size to a divisor of {total}")
            return
        steps = total // gbs
    elif gbs * steps != total:
        fix = f"set train.global_batch_size={total // steps}" if total % steps == 0 else ""
        fix2 = f"train.num_steps_per_rollout={total // gbs}" if total % gbs == 0 else ""
        fixes = " or ".join(x for x in (fix, fix2) if x) or "change the batch sizes"
        problems.append(f"{lhs} must equal train.global_batch_size × train.num_steps_per_rollout = {gbs} × {steps}; {fixes}")
        return
    t.global_batch_size, t.num_steps_per_rollout = gbs, steps
    if t.micro_batch_size is None:  # one micro-batch per step: a rank's share of the global batch
        t.micro_batch_size = max(gbs // data_parallel_ranks(cfg)[0], 1)
    notes.append(f"batch: {lhs} = train.global_batch_size × train.num_steps_per_rollout = {gbs} × {steps}"
                 f" (train.micro_batch_size={t.micro_batch_size})")
    if t.micro_batch_size < 1 or gbs % t.micro_batch_size:
        problems.append(f"train.micro_batch_size={t.micro_batch_size} must divide train.global_batch_size={gbs}; set train.micro_batch_size to a divisor of {gbs}")


def data_parallel_ranks(cfg: RunConfig) -> tuple[int, str]:
    """The ranks a step's batch splits over, and how they were counted: every train rank of cluster.backend=ray
    (torch: each a data-parallel rank), megatron's model-parallel ranks (TP × PP × CP) taking one share together."""
    c, p = cfg.cluster, cfg.parallelism
    ranks = c.actor_num_nodes * c.actor_num_gpus_per_node if c.backend == "ray" else 1
    how = f"cluster.actor_num_nodes × cluster.actor_num_gpus_per_node = {c.actor_num_nodes} × {c.actor_num_gpus_per_node} = {ranks}"
    model = p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size
    if cfg.train.backend == "megatron" and model > 1 and ranks % model == 0:  # (a layout that does not divide is refused)
        how = f"{ranks} ranks / (TP × PP × CP = {model})"
        ranks //= model
    return max(ranks, 1), how


def check_values(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
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
    if r.n_samples_per_prompt == 1 and a.grpo_std_normalization:  # slime: warn and turn it off
        a.grpo_std_normalization = False
        notes.append("algorithm.grpo_std_normalization turned off: a group of rollout.n_samples_per_prompt=1 has no std")
    if a.eps_clip <= 0 or (a.eps_clip_high is not None and a.eps_clip_high <= 0):
        problems.append("algorithm.eps_clip and algorithm.eps_clip_high must be > 0")
    if a.eps_clip_c is not None and a.eps_clip_c <= 1:
        problems.append(f"algorithm.eps_clip_c={a.eps_clip_c} must be > 1 (dual-clip lower bound)")
    if a.kl_loss_coef != 0 and not a.use_kl_loss:
        problems.append(f"algorithm.kl_loss_coef={a.kl_loss_coef} has no effect without algorithm.use_kl_loss=true; set it or set algorithm.kl_loss_coef=0")
    if t.lr <= 0:
        problems.append(f"train.lr={t.lr} must be > 0")
    if t.skip_zero_advantage_samples and (a.use_kl_loss or a.entropy_coef != 0 or a.custom_loss):
        t.skip_zero_advantage_samples = False
        notes.append("train.skip_zero_advantage_samples turned off: the KL/entropy/custom loss terms depend on every sample")
    check_algorithm(cfg, problems)
    check_model_impl(cfg, problems, notes)
    check_model_training(cfg, problems, notes)
    if cfg.train.backend == "torch":
        p = cfg.parallelism
        if (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size, p.expert_model_parallel_size) != (1, 1, 1, 1):
            problems.append("parallelism sizes other than 1 need the megatron backend; set parallelism=single or train.backend=megatron")


NATIVE_MODEL_TYPES = ("qwen3", "llama")  # models/native.py: dense blocks, default rope, no biases


def check_model_impl(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    """model.model_impl=native runs only what models/native.py implements (read from config.json when
    model.hf_checkpoint is set, JSON only, else from the model group's fields); auto resolves to native
    where it can run and to transformers elsewhere, with a note."""
    m = cfg.model
    if m.model_impl not in ("native", "auto"):
        return
    config = {"model_type": m.architecture, "use_rope_scaling": m.use_rope_scaling, "add_qkv_bias": m.add_qkv_bias,
              "num_experts": m.num_experts, "swiglu": m.swiglu, "normalization": m.normalization}
    source = "the model group's fields"
    if m.hf_checkpoint:
        path = Path(m.hf_checkpoint) / "config.json"
        if not path.is_file():  # the checkpoint's own check reports it
            m.model_impl = "transformers" if m.model_impl == "auto" else m.model_impl
            return
        config, source = json.loads(path.read_text()), str(path)
    why = []
    if config.get("model_type") not in NATIVE_MODEL_TYPES:
        why.append(f"model_type {config.get('model_type')!r} (native runs {', '.join(NATIVE_MODEL_TYPES)})")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        why.append(f"rope_type {rope.get('rope_type', rope.get('type'))!r} (native runs default rope)")
    if config.get("hidden_act", "silu") != "silu":
        why.append(f"hidden_act {config['hidden_act']!r} (native runs silu)")
    why += [f"{flag}=true" for flag in ("attention_bias", "mlp_bias", "use_sliding_window", "use_rope_scaling", "add_qkv_bias")
            if config.get(flag)]
    if config.get("num_experts"):
        why.append("MoE (num_experts set)")
    if not config.get("swiglu", True) or config.get("normalization", "RMSNorm") != "RMSNorm":
        why.append("not an RMSNorm + SwiGLU block")
    if config.get("pretraining_tp", 1) != 1:
        why.append("pretraining_tp != 1")
    if m.model_impl == "auto":
        m.model_impl = "transformers" if why else "native"
        notes.append(f"model.model_impl=auto: {m.model_impl}" + (f" ({'; '.join(why)})" if why else ""))
    elif why:
        problems.append(f"model.model_impl=native cannot run this model ({source}: {'; '.join(why)}); "
                        "set model.model_impl=transformers or auto")


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


def check_data(cfg: RunConfig, problems: list[str]) -> None:
    def one(key: str, path: Optional[str]) -> None:
        if not path:
            problems.append(f"{key} is not set; set it to a jsonl file of {{\"{cfg.data.input_key}\": ..., \"{cfg.data.label_key}\": ...}} lines")
        elif not Path(path).is_file():
            problems.append(Missing(f"{key}={path}: file not found; set {key} to an existing jsonl file", key, path))
        elif Path(path).stat().st_size == 0 or (not path.endswith(".parquet") and not any(line.strip() for line in open(path, "rb"))):
            problems.append(f"{key}={path}: the file is empty; it needs one JSON object per line")

    check_prompt_data(cfg, problems)  # a glob, a directory, a Hugging Face dataset too
    check_streaming(cfg, problems)
    for name, ds in eval_datasets(cfg, problems).items():
        one(f"eval.eval_prompt_data.{name}" + ("" if isinstance(cfg.eval.eval_prompt_data[name], str) else ".path"), ds.path)


def eval_datasets(cfg: RunConfig, problems: Optional[list[str]] = None) -> dict[str, EvalDatasetConfig]:
    """eval.eval_prompt_data -> one fully resolved EvalDatasetConfig per name (fallbacks filled in)."""
    e, r = cfg.eval, cfg.rollout
    fields = {f.name for f in dataclasses.fields(EvalDatasetConfig)}
    out = {}
    for name, spec in e.eval_prompt_data.items():
        spec = {"path": spec} if isinstance(spec, str) else dict(spec or {})
        unknown = sorted(set(spec) - fields)
        if unknown and problems is not None:
            problems.append(f"eval.eval_prompt_data.{name}: unknown key(s) {unknown}; valid keys: {sorted(fields)}")
        spec = {k: v for k, v in spec.items() if k in fields}
        ds = EvalDatasetConfig(**{"path": None, **spec})
        pick = lambda v, *fallbacks: next((x for x in (v, *fallbacks) if x is not None), None)  # noqa: E731
        out[name] = EvalDatasetConfig(
            path=ds.path, input_key=pick(ds.input_key, cfg.data.input_key), label_key=pick(ds.label_key, cfg.data.label_key),
            metadata_key=pick(ds.metadata_key, cfg.data.metadata_key),
            rm_type=pick(ds.rm_type, cfg.reward.rm_type),
            n_samples_per_eval_prompt=pick(ds.n_samples_per_eval_prompt, e.n_samples_per_eval_prompt),
            eval_temperature=pick(ds.eval_temperature, e.eval_temperature, r.rollout_temperature),
            eval_top_p=pick(ds.eval_top_p, e.eval_top_p, r.rollout_top_p),
            eval_top_k=pick(ds.eval_top_k, e.eval_top_k, r.rollout_top_k),
            eval_max_response_len=pick(ds.eval_max_response_len, e.eval_max_response_len, r.rollout_max_response_len))
    return out


def check(cfg: RunConfig) -> tuple[RunConfig, list[str], list[str]]:
    cfg = dataclasses.replace(cfg)  # shallow: derivations below replace nested values in place
    cfg.train = dataclasses.replace(cfg.train)
    cfg.model = dataclasses.replace(cfg.model)  # model.model_impl=auto is resolved in place
    cfg.cluster = dataclasses.replace(cfg.cluster)
    problems: list[str] = []
    notes: list[str] = []
    check_values(cfg, problems, notes)
    check_batch(cfg, problems, notes)
    check_microbatch(cfg, problems, notes)
    derive_num_rollout(cfg, problems, notes)
    check_run(cfg, problems)
    check_debug(cfg, problems, notes)
    check_buffer(cfg, problems, notes)
    check_data(cfg, problems)
    check_target("reward.custom_rm", cfg.reward.custom_rm, 1, problems)
    check_agent(cfg, problems)
    check_stall_watchdog(cfg, problems)
    check_cluster(cfg, problems, notes)
    check_ray_pairing(cfg.cluster, cfg.train, cfg.rollout, cfg.algorithm, cfg.parallelism, problems)
    return cfg, problems, notes


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


def check_cluster(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    """Static resource-layout checks and slime's derivations; what the Ray cluster holds is checked at
    orchestration start (slime_hydra/orchestration/placement.py), before any actor is built."""
    c = cfg.cluster
    for key in ("actor_num_nodes", "actor_num_gpus_per_node"):
        if getattr(c, key) < 1:
            problems.append(f"cluster.{key}={getattr(c, key)} must be >= 1")
    actor = c.actor_num_nodes * c.actor_num_gpus_per_node
    actor_txt = f"cluster.actor_num_nodes × cluster.actor_num_gpus_per_node = {c.actor_num_nodes} × {c.actor_num_gpus_per_node} = {actor}"
    if c.rollout_num_gpus is None:
        if c.colocate:
            c.rollout_num_gpus = actor  # slime: colocated rollout uses the actor's GPUs
        else:
            problems.append("cluster.rollout_num_gpus is not set and cluster.colocate=false; set cluster.rollout_num_gpus "
                            "(the GPUs of the rollout engines) or cluster.colocate=true")
            return
    per = c.rollout_num_gpus_per_engine
    if c.rollout_num_gpus < 1:
        problems.append(f"cluster.rollout_num_gpus={c.rollout_num_gpus} must be >= 1")
    elif per >= 1 and c.rollout_num_gpus % per:
        problems.append(f"cluster.rollout_num_gpus={c.rollout_num_gpus} is not divisible by cluster.rollout_num_gpus_per_engine={per}; "
                        f"set cluster.rollout_num_gpus to a multiple of {per} or cluster.rollout_num_gpus_per_engine to a divisor of it")
    c.offload_train = c.colocate if c.offload_train is None else c.offload_train
    c.offload_rollout = c.colocate if c.offload_rollout is None else c.offload_rollout
    for key in ("placement_timeout_s", "ray_call_timeout_s", "distributed_timeout_s"):
        if getattr(c, key) <= 0:
            problems.append(f"cluster.{key}={getattr(c, key)} must be > 0 (seconds)")
    if c.backend == "local":
        if actor > 1:
            problems.append(f"{actor_txt} data-parallel train ranks need cluster.backend=ray (one Ray actor per rank); "
                            "set cluster.backend=ray or cluster.actor_num_gpus_per_node=1")
        if c.address is not None:
            problems.append(f"cluster.address={c.address} is only read with cluster.backend=ray; set cluster.backend=ray or drop it")
    if cfg.rollout.backend == "local":
        if per != 1:
            problems.append(f"cluster.rollout_num_gpus_per_engine={per}: a rollout.backend=local engine runs on one device; "
                            "set cluster.rollout_num_gpus_per_engine=1")
        if c.backend == "local" and c.rollout_num_gpus not in (1, actor):
            problems.append(f"cluster.rollout_num_gpus={c.rollout_num_gpus} engines need cluster.backend=ray "
                            "(cluster.backend=local runs one engine in the driver); set cluster.backend=ray")
    gbs = cfg.train.global_batch_size
    dp, dp_txt = data_parallel_ranks(cfg)
    if c.backend == "ray" and gbs and gbs % dp:
        problems.append(f"train.global_batch_size={gbs} is not divisible by the {dp} data-parallel ranks ({dp_txt}); "
                        f"set train.global_batch_size to a multiple of {dp}")
    # micro_batch_size still None here means the batch identity failed (already reported)
    elif c.backend == "ray" and gbs and cfg.train.micro_batch_size and (gbs // dp) % cfg.train.micro_batch_size:
        problems.append(f"train.micro_batch_size={cfg.train.micro_batch_size} must divide the per-rank batch train.global_batch_size / "
                        f"data-parallel ranks = {gbs} / {dp} = {gbs // dp}; set train.micro_batch_size to a divisor of {gbs // dp}")
    if c.backend == "ray":
        notes.append(f"cluster: {actor_txt} train ranks, cluster.rollout_num_gpus={c.rollout_num_gpus} in "
                     f"{c.rollout_num_gpus // max(per, 1)} engine(s), {'colocated' if c.colocate else 'disaggregated'}")
