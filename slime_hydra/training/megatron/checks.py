"""Checks of the model / parallelism / train groups for train.backend=megatron (no megatron import).

Called by the composition floor (app/checks.py) before anything is built, with only the groups it
reads; each problem names the key and the fix.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from slime_hydra.config.schema import ClusterConfig, MegatronConfig, ModelConfig, ParallelismConfig, TrainConfig
from slime_hydra.models.hf_check import check_hf_config


def check(model: ModelConfig, parallelism: ParallelismConfig, train: TrainConfig, device: str, load: Optional[str]) -> list[str]:
    """Parallel layout against the model, recompute keys, speed keys, a checkpoint to resume (`load`), and the
    HF checkpoint's config.json. `device` is cluster.device."""
    m, p, problems = model, parallelism, []
    tp, pp, cp, ep = (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
                      p.expert_model_parallel_size)
    for key, v in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp), ("context_parallel_size", cp),
                   ("expert_model_parallel_size", ep)):
        if v < 1:
            problems.append(f"parallelism.{key}={v} must be >= 1")
    if min(tp, pp, cp, ep) < 1:
        return problems
    if m.num_attention_heads % tp:
        problems.append(f"parallelism.tensor_model_parallel_size={tp} must divide model.num_attention_heads={m.num_attention_heads}")
    if not m.multi_latent_attention and m.num_query_groups % tp:
        problems.append(f"parallelism.tensor_model_parallel_size={tp} must divide model.num_query_groups={m.num_query_groups}")
    if m.num_layers % pp:
        problems.append(f"parallelism.pipeline_model_parallel_size={pp} must divide model.num_layers={m.num_layers}")
    if cp > 1:
        problems.append(f"parallelism.context_parallel_size={cp}: context parallelism needs Transformer Engine's attention, "
                        "which this backend does not use; set parallelism.context_parallel_size=1")
    problems += check_experts(m, p)
    if p.sequence_parallel and tp == 1:  # megatron's TransformerConfig refuses it too
        problems.append("parallelism.sequence_parallel=true splits the sequence over the tensor-parallel ranks, and "
                        "parallelism.tensor_model_parallel_size=1 has one; set tensor_model_parallel_size>1 or "
                        "sequence_parallel=false")
    if p.recompute_granularity not in (None, "full", "selective"):
        problems.append(f"parallelism.recompute_granularity={p.recompute_granularity!r} is not one of [null, 'full', 'selective']")
    if p.recompute_activations and p.recompute_granularity not in (None, "selective"):
        problems.append("parallelism.recompute_activations=true means recompute_granularity=selective; drop one of them")
    if p.recompute_granularity == "full":
        if p.recompute_method not in ("uniform", "block") or not p.recompute_num_layers:
            problems.append("parallelism.recompute_granularity=full needs parallelism.recompute_method=uniform|block and "
                            "parallelism.recompute_num_layers>=1")
    elif p.recompute_method is not None or p.recompute_num_layers is not None:
        problems.append("parallelism.recompute_method / recompute_num_layers apply only with parallelism.recompute_granularity=full")
    if p.recompute_modules is not None:
        allowed = {"core_attn", "mlp", "layernorm", "moe", "shared_experts"} | ({"mla_up_proj"} if m.multi_latent_attention else set())
        if (p.recompute_granularity or ("selective" if p.recompute_activations else None)) != "selective":
            problems.append("parallelism.recompute_modules applies only with parallelism.recompute_granularity=selective; "
                            "set it or drop parallelism.recompute_modules")
        if bad := [x for x in p.recompute_modules if x not in allowed]:
            problems.append(f"parallelism.recompute_modules: {bad} not among {sorted(allowed)} (megatron's names)")
    check_speed(train.megatron, device, problems)
    check_resume(load, p.use_distributed_optimizer, problems)
    from slime_hydra.training.megatron.convert import check_convertible  # convert.py imports torch: megatron runs only

    problems += check_convertible(m)
    if m.hf_checkpoint:
        problems += check_hf_config(m, m.hf_checkpoint)
    return problems


def check_experts(m: ModelConfig, p: ParallelismConfig) -> list[str]:
    """Expert parallelism against the model: EP splits the routed experts, the expert-TP size their matrices; megatron's
    alltoall dispatcher is the one that takes this backend's variable sequence lengths."""
    ep, etp = p.expert_model_parallel_size, p.expert_tensor_parallel_size
    problems = []
    if etp is not None and etp < 1:
        problems.append(f"parallelism.expert_tensor_parallel_size={etp} must be >= 1 (or null: the tensor-parallel size)")
    if not m.num_experts:
        if ep > 1 or etp is not None:
            problems.append(f"parallelism.expert_model_parallel_size={ep} / expert_tensor_parallel_size={etp} apply to MoE "
                            f"models and model={m.name} has no experts (model.num_experts=null); set them to 1 / null")
        return problems
    if m.num_experts % ep:
        problems.append(f"parallelism.expert_model_parallel_size={ep} must divide model.num_experts={m.num_experts} (each "
                        "EP rank holds an equal share of the routed experts)")
    if etp and etp >= 1 and m.moe_ffn_hidden_size and m.moe_ffn_hidden_size % etp:
        problems.append(f"parallelism.expert_tensor_parallel_size={etp} must divide model.moe_ffn_hidden_size="
                        f"{m.moe_ffn_hidden_size}")
    if m.moe_token_dispatcher_type != "alltoall":
        problems.append(f"model.moe_token_dispatcher_type={m.moe_token_dispatcher_type}: megatron's allgather dispatcher "
                        "refuses variable sequence lengths, which this backend's micro-batches have; set "
                        "model.moe_token_dispatcher_type=alltoall")
    if p.tensor_model_parallel_size > 1 and not p.sequence_parallel:
        problems.append(f"parallelism.tensor_model_parallel_size={p.tensor_model_parallel_size} with an MoE model needs "
                        "parallelism.sequence_parallel=true: megatron's MoE layer refuses to train tensor-parallel without "
                        "it (each TP rank would route every token); set parallelism.sequence_parallel=true")
    if m.moe_router_dtype not in (None, "fp32", "fp64"):
        problems.append(f"model.moe_router_dtype={m.moe_router_dtype!r} is not one of [null, 'fp32', 'fp64'] (megatron's)")
    return problems


def optimizer_kind_mismatch(saved: dict, use_distributed_optimizer: bool, where: str, dp_now: str = "") -> str | None:
    """The problem text when a megatron checkpoint's optimizer kind (its common part's optimizer_layout) is not this run's."""
    if saved is None or saved["use_distributed_optimizer"] == use_distributed_optimizer:
        return None
    want = str(saved["use_distributed_optimizer"]).lower()
    return (f"parallelism.use_distributed_optimizer={str(use_distributed_optimizer).lower()}, but {where} was written with "
            f"parallelism.use_distributed_optimizer={want} (data-parallel size {saved['data_parallel_size']}{dp_now}): its "
            f"optimizer state cannot load into the other optimizer; set parallelism.use_distributed_optimizer={want} to resume it")


def check_resume(load: Optional[str], use_distributed_optimizer: bool, problems: list[str]) -> None:
    """load= a megatron checkpoint: its optimizer kind must be this run's (the loader checks again: checkpoint.py)."""
    if load is None:
        return
    ckpt = Path(load)
    if (ckpt / "latest").is_file():  # a save root: engine.checkpoint.resolve_checkpoint's rule, without importing the engine
        ckpt = ckpt / (ckpt / "latest").read_text().strip()
    common = ckpt / "megatron" / "common.pt"
    if not common.is_file():
        return  # not a megatron checkpoint, or missing: config/checks.py / the engine's loader name it
    import torch

    saved = torch.load(common, map_location="cpu", weights_only=True).get("optimizer_layout")
    if problem := optimizer_kind_mismatch(saved, use_distributed_optimizer, str(common.parent)):
        problems.append(problem)


def check_speed(mg: MegatronConfig, device: str, problems: list[str]) -> None:
    """train.megatron: the log-prob chunk size, and torch.compile only where Triton can compile (CUDA)."""
    if mg.log_probs_chunk_size != -1 and mg.log_probs_chunk_size < 1:
        problems.append(f"train.megatron.log_probs_chunk_size={mg.log_probs_chunk_size} must be >= 1 (tokens per chunk) "
                        "or -1 (one chunk)")
    compiled = [k for k in ("compile_layers", "compile_log_probs") if getattr(mg, k)]
    if compiled:
        where = device
        if where == "auto":
            import torch  # only when a compile flag is set: validation stays free of torch otherwise

            where = "cuda" if torch.cuda.is_available() else "cpu"
        if where != "cuda":
            keys = " and ".join(f"train.megatron.{k}=true" for k in compiled)
            fix = " ".join(f"train.megatron.{k}=false" for k in compiled)
            problems.append(f"{keys} needs a CUDA device (cluster.device={device} runs on cpu here); "
                            f"set {fix} or cluster.device=cuda")


def check_unused(train: TrainConfig) -> list[str]:
    """train.megatron.* set with another train.backend would be silently ignored: name them."""
    changed = [f"train.megatron.{f.name}" for f in dataclasses.fields(MegatronConfig)
               if getattr(train.megatron, f.name) != f.default]
    changed += [f"train.{key}" for key in HOOKS if getattr(train, key)]  # the train ranks' hooks run in megatron's step
    if changed:
        return [f"{', '.join(changed)} apply only with train.backend=megatron (train.backend={train.backend}); "
                "drop them or set train.backend=megatron"]
    return []


HOOKS = ("custom_megatron_init", "custom_megatron_before_log_prob_hook", "custom_megatron_before_train_step_hook")


def check_batching(train: TrainConfig, p: ParallelismConfig, m: ModelConfig) -> list[str]:
    """Packed micro-batches (train.qkv_format=thd) and token budgets (train.use_dynamic_batch_size) where this
    backend runs them."""
    problems = []
    if train.qkv_format == "thd":
        # what the packed path (training/megatron/runner.py, model.SDPAttention._thd) is built and tested for
        refused = [f"{key}={value}" for key, value, ok in (
            ("parallelism.pipeline_model_parallel_size", p.pipeline_model_parallel_size, 1),
            ("parallelism.context_parallel_size", p.context_parallel_size, 1),
            ("parallelism.sequence_parallel", str(p.sequence_parallel).lower(), "false"),
            ("model.multi_latent_attention", str(m.multi_latent_attention).lower(), "false")) if value != ok]
        if refused:
            problems.append(f"train.qkv_format=thd with train.backend=megatron runs with tensor and data parallelism only, "
                            f"not with {', '.join(refused)} (the packed stream is not padded to a multiple of TP x CP, and the pipelined "
                            "and MLA paths do not pack); set train.qkv_format=bshd, or those keys to their defaults")
    pp = p.pipeline_model_parallel_size
    if train.use_dynamic_batch_size and pp > 1:
        # the pipeline schedule pads every micro-batch to the longest of the step, so a micro-batch's cost is not
        # rows × its own longest, which the budget bounds
        problems.append(f"train.use_dynamic_batch_size=true with parallelism.pipeline_model_parallel_size={pp}: the megatron "
                        "backend pads every pipelined micro-batch to the step's longest sample, which the token budget does "
                        "not bound; set parallelism.pipeline_model_parallel_size=1 or train.use_dynamic_batch_size=false")
    return problems


def model_parallel_size(p: ParallelismConfig) -> int:
    """The ranks of one model replica (TP × PP × CP): they take one share of a step's batch together."""
    return p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size


def check_layout(p: ParallelismConfig, c: ClusterConfig) -> list[str]:
    """megatron splits the train ranks into TP × PP × CP model-parallel blocks; what is left over is data parallel."""
    block = model_parallel_size(p)
    if block < 1:  # check() names the size below 1
        return []
    if c.backend == "ray":
        ranks = c.actor_num_nodes * c.actor_num_gpus_per_node
        where = f"cluster.actor_num_nodes × cluster.actor_num_gpus_per_node = {c.actor_num_nodes} × {c.actor_num_gpus_per_node} = {ranks}"
    else:
        ranks, where = 1, "cluster.backend=local: 1"
    problems = _check_expert_layout(p, ranks, where) if ranks >= 1 and ranks % block == 0 else []
    if ranks < 1 or ranks % block == 0:
        return problems
    return [f"parallelism.tensor_model_parallel_size × pipeline_model_parallel_size × context_parallel_size = "
            f"{p.tensor_model_parallel_size} × {p.pipeline_model_parallel_size} × {p.context_parallel_size} = {block} "
            f"must divide the train ranks ({where}); set cluster.actor_num_gpus_per_node to a multiple of {block}"
            + (" with cluster.backend=ray" if c.backend != "ray" else "") + " or lower the parallel sizes"]


def _check_expert_layout(p: ParallelismConfig, ranks: int, where: str) -> list[str]:
    """megatron's second grid: expert-TP × EP × PP must divide the ranks (what is left is the experts' data parallel)."""
    ep = p.expert_model_parallel_size
    etp = p.expert_tensor_parallel_size or p.tensor_model_parallel_size
    grid = etp * ep * p.pipeline_model_parallel_size
    if min(ep, etp) < 1 or ranks % grid == 0:
        return []
    return [f"parallelism.expert_tensor_parallel_size × expert_model_parallel_size × pipeline_model_parallel_size = "
            f"{etp} × {ep} × {p.pipeline_model_parallel_size} = {grid} must divide the train ranks ({where}); lower "
            "parallelism.expert_model_parallel_size or expert_tensor_parallel_size, or add ranks"]
