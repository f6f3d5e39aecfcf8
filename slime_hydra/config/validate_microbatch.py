"""Validation of token-budget micro-batches (train.use_dynamic_batch_size, training/microbatch.py) and of packed
micro-batches (train.qkv_format, training/thd.py)."""

from __future__ import annotations

from slime_hydra.config.schema import RunConfig


def check_packing(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    t = cfg.train
    if t.qkv_format != "thd":
        return
    if t.backend == "megatron":
        # what the packed path (training/megatron/backend.py, model.SDPAttention._thd) is built and tested for
        p, m = cfg.parallelism, cfg.model
        refused = [f"{key}={value}" for key, value, ok in (
            ("parallelism.pipeline_model_parallel_size", p.pipeline_model_parallel_size, 1),
            ("parallelism.context_parallel_size", p.context_parallel_size, 1),
            ("parallelism.sequence_parallel", str(p.sequence_parallel).lower(), "false"),
            ("model.multi_latent_attention", str(m.multi_latent_attention).lower(), "false")) if value != ok]
        if refused:
            problems.append(f"train.qkv_format=thd with train.backend=megatron runs with tensor and data parallelism only, "
                            f"not with {', '.join(refused)} (the packed stream is not padded to a multiple of TP x CP, and the pipelined "
                            "and MLA paths do not pack); set train.qkv_format=bshd, or those keys to their defaults")
    elif cfg.model.model_impl == "transformers" and t.prefix_sharing:
        t.prefix_sharing = False
        notes.append("train.prefix_sharing turned off: with train.qkv_format=thd each sample runs its own prompt in the packed "
                     "row (model.model_impl=native packs and shares prompts)")


def check_microbatch(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    t = cfg.train
    check_packing(cfg, problems, notes)
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
    pp = cfg.parallelism.pipeline_model_parallel_size
    if t.backend == "megatron" and pp > 1:
        # the pipeline schedule pads every micro-batch to the longest of the step, so a micro-batch's cost is not
        # rows × its own longest, which the budget bounds
        problems.append(f"train.use_dynamic_batch_size=true with parallelism.pipeline_model_parallel_size={pp}: the megatron "
                        "backend pads every pipelined micro-batch to the step's longest sample, which the token budget does "
                        "not bound; set parallelism.pipeline_model_parallel_size=1 or train.use_dynamic_batch_size=false")
    budget = t.max_tokens_per_gpu
    longest = cfg.rollout.rollout_max_response_len + (cfg.data.rollout_max_prompt_len or 0)
    if budget is not None and budget >= 1 and cfg.data.rollout_max_prompt_len and budget < longest:
        notes.append(f"train.max_tokens_per_gpu={budget} < data.rollout_max_prompt_len + rollout.rollout_max_response_len = "
                     f"{longest}: a sample longer than the budget trains alone in its own micro-batch")
