"""The memory plan of a run's config (orchestration/memory_plan.py's figures), its table, and its check before launch.

Which GPUs a run has: a colocated run's every GPU holds a train rank and an engine rank; a disaggregated one has
train GPUs and engine GPUs; cluster.backend=local puts its SGLang engines beside the trainer (one GPU) unless
cluster.colocate=false. The device's memory is cluster.gpu_memory_gb, else the first CUDA device of this machine.
A layout whose peak exceeds it is refused at validation (exit 2), naming what would make it fit: the offload keys
when it fits with them, else the figures and the keys that shrink them; cluster.allow_over_memory=true lets it run.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from slime_hydra.algorithms.estimators import ESTIMATORS
from slime_hydra.config.schema import ClusterConfig, ModelConfig, RunConfig
from slime_hydra.models.size import hf_dims
from slime_hydra.orchestration import memory_plan as MP
from slime_hydra.orchestration.train_memory import GIB, TrainInputs, TrainMemory, gib, train_memory

REFUSED = "the memory plan"  # the start of every refusal here (`slime-hydra plan` prints the table, then these)


def device_memory(c: ClusterConfig) -> tuple[Optional[int], str]:
    """(bytes of one GPU, where the figure comes from); None where there is none to check against."""
    if c.gpu_memory_gb is not None:
        return int(c.gpu_memory_gb * GIB), f"cluster.gpu_memory_gb={c.gpu_memory_gb:g}"
    if c.device == "cpu":
        return None, "cluster.device=cpu"
    found = nvml_memory()
    if found is None:
        return None, "no CUDA device on this machine: set cluster.gpu_memory_gb (GiB) for a verdict"
    return found[0], f"{found[1]}, this machine's first GPU"


def nvml_memory() -> Optional[tuple[int, str]]:
    """(total bytes, name) of the first visible GPU, from the driver (NVML: no CUDA context, so validation and the
    plan start nothing on the device); torch's view where NVML is not installed; None without a GPU."""
    import os

    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    try:
        import pynvml  # nvidia-ml-py, which torch's CUDA builds bring
    except ImportError:
        import torch  # lazily: validation imports no torch otherwise

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
        return props.total_memory, props.name
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver: no GPU here
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)
        name = pynvml.nvmlDeviceGetName(handle)
        return pynvml.nvmlDeviceGetMemoryInfo(handle).total, name.decode() if isinstance(name, bytes) else name
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def model_dims(m: ModelConfig) -> ModelConfig:
    """The model group with the dimensions of model.hf_checkpoint's config.json, when it has one."""
    path = Path(m.hf_checkpoint) / "config.json" if m.hf_checkpoint else None
    try:
        hf = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):  # missing or broken: the checkpoint checks report it
        hf = None
    if not isinstance(hf, dict):
        return m
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    return dataclasses.replace(m, **{k: v for k, v in hf_dims(hf).items() if k in fields})


@dataclass(frozen=True)
class Plan:
    train: Optional[TrainMemory]  # None: nothing trains (debug_rollout_only)
    engine: Optional[MP.EngineMemory]  # None: nothing generates (load_debug_rollout_data)
    gpus: dict[str, Optional[MP.GpuMemory]]  # kind of GPU -> its phases (None: the SGLang pool is not known here)
    offload_train: bool
    offload_rollout: bool
    sglang: bool

    @property
    def peak(self) -> Optional[int]:
        known = [g.peak for g in self.gpus.values() if g is not None]
        return max(known) if known and len(known) == len(self.gpus) else None


def engine_released(cfg: RunConfig) -> bool:
    """offload_rollout takes effect: SGLang releases only with its memory saver (on unless the user turned it off)."""
    r = cfg.rollout
    return bool(cfg.cluster.offload_rollout) and r.backend == "sglang" and r.sglang.get("enable_memory_saver", True) is not False


def plan(cfg: RunConfig, device: Optional[int], offload_train: Optional[bool] = None, offload_rollout: Optional[bool] = None,
         mem_fraction_static: Optional[float] = None) -> Plan:
    """The run's per-GPU memory; the keyword arguments replace the config's values (what-ifs for the verdict)."""
    c, r, m = cfg.cluster, cfg.rollout, model_dims(cfg.model)
    ot = bool(c.offload_train) if offload_train is None else offload_train
    orl = engine_released(cfg) if offload_rollout is None else offload_rollout
    sglang = r.backend == "sglang"
    world = c.actor_num_nodes * c.actor_num_gpus_per_node if c.backend == "ray" else 1
    engine_tp = c.rollout_num_gpus_per_engine if sglang else 1
    vocab = m.vocab_size or 0
    max_seq = (cfg.data.rollout_max_prompt_len or 0) + r.rollout_max_response_len
    a = cfg.algorithm
    t = None if cfg.debug_rollout_only else train_memory(m, cfg.parallelism, cfg.train, TrainInputs(
        world, vocab, max_seq, cfg.train.global_batch_size or 1, a.use_kl_loss or a.kl_coef != 0,
        ESTIMATORS[a.advantage_estimator].critic, cfg.train.backend == "megatron",
        r.update_weight_buffer_size if sglang else 0))
    mfs = mem_fraction_static if mem_fraction_static is not None else r.sglang.get("mem_fraction_static")
    e = None if cfg.load_debug_rollout_data else MP.engine_memory(
        m, vocab, engine_tp, mfs if sglang else None, 0 if sglang else r.generation_batch_size * max_seq)
    shared = c.colocate or (c.backend == "local" and not sglang)
    if t is None or e is None:
        gpus = {"train": MP.train_only(t)} if t is not None else {"engine": MP.engine_only(e, device) if sglang else None}
    elif shared:
        gpus = {"train + engine": MP.colocated(t, e, device, ot, orl, sglang)}
    else:
        gpus = {"train": MP.train_only(t), "engine": MP.engine_only(e, device) if sglang else None}
    return Plan(t, e, gpus, ot, orl, sglang)


# -- the verdict -------------------------------------------------------------------------------------------------------
def check(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """(problems, notes) of the memory plan against the device: a layout over the device's memory is refused (a note
    with cluster.allow_over_memory=true), as is an SGLang pool smaller than the engine's weights."""
    device, source = device_memory(cfg.cluster)
    if device is None:
        return [], []
    p = plan(cfg, device)
    found = pool_problems(cfg, p) + ([over_memory(cfg, p, device, source)] if (p.peak or 0) > device else [])
    if cfg.cluster.allow_over_memory:
        return [], [f"{f} (cluster.allow_over_memory=true: running it anyway)" for f in found]
    return found, []


def offload_problems(cfg: RunConfig) -> list[str]:
    c = cfg.cluster
    if c.offload_train and cfg.train_mode == "async":
        return ["cluster.offload_train=true releases the trainer while the engines generate, but train_mode=async trains "
                "while they generate; set cluster.offload_train=false"]
    return []


def pool_problems(cfg: RunConfig, p: Plan) -> list[str]:
    pools = [g.pool for g in p.gpus.values() if g is not None and g.pool is not None]
    if p.engine is None or not pools or min(pools) > p.engine.weights:
        return []
    return [f"{REFUSED}: rollout.sglang.mem_fraction_static={p.engine.mem_fraction_static} leaves an SGLang engine {gib(min(pools)):.1f} "
            f"GiB for {gib(p.engine.weights):.1f} GiB of weights and no KV cache; raise rollout.sglang.mem_fraction_static, "
            "set cluster.offload_train=true (the engines then start beside a released trainer) or "
            "cluster.rollout_num_gpus_per_engine higher"]


def over_memory(cfg: RunConfig, p: Plan, device: int, source: str) -> str:
    head = (f"{REFUSED} needs {gib(p.peak):.1f} GiB on a GPU ({figures(p)}), more than its {gib(device):.1f} GiB "
            f"({source}); `slime-hydra plan` shows every figure (docs/memory.md)")
    fixes = []
    if p.sglang and "train + engine" in p.gpus and not (p.offload_train and p.offload_rollout):
        both = plan(cfg, device, offload_train=True, offload_rollout=True)
        if (both.peak or device + 1) <= device:
            fixes.append(f"set cluster.offload_train=true cluster.offload_rollout=true (then {gib(both.peak):.1f} GiB)")
        f = MP.largest_fraction(p.train, device, offload_train=False)
        if f >= 0.05 and p.engine.mem_fraction_static and f < p.engine.mem_fraction_static:
            fixes.append(f"lower rollout.sglang.mem_fraction_static to {int(f * 100) / 100:.2f} (without offload)")
    if fixes:
        return f"{head}; it fits if you {' or '.join(fixes)}"
    return f"{head}; to fit, {shrinking_keys(cfg, p)}"


def figures(p: Plan) -> str:
    name, gpu = max(((k, g) for k, g in p.gpus.items() if g is not None), key=lambda kv: kv[1].peak)
    phase = "generating" if gpu.generate >= gpu.train else "training"
    parts = [f"{name} GPU while {phase}"]
    if p.train is not None:
        t = p.train
        parts.append(f"trainer state {gib(t.state):.1f}, step {gib(t.peak - t.state):.1f} at {t.tokens} tokens per micro-batch")
    if gpu.pool is not None:
        parts.append(f"SGLang pool {gib(gpu.pool):.1f}")
    return ", ".join(parts)


def shrinking_keys(cfg: RunConfig, p: Plan) -> str:
    """The keys that shrink the largest terms, with their values now."""
    par, t, keys = cfg.parallelism, cfg.train, []
    if p.train is not None:
        if t.backend == "megatron":
            keys.append(f"raise parallelism.tensor_model_parallel_size ({par.tensor_model_parallel_size}) or "
                        f"pipeline_model_parallel_size ({par.pipeline_model_parallel_size})"
                        + (f" or expert_model_parallel_size ({par.expert_model_parallel_size})" if cfg.model.num_experts else ""))
            if not par.use_distributed_optimizer:
                keys.append("set parallelism.use_distributed_optimizer=true (with more than one data-parallel rank)")
            if par.recompute_granularity != "full":
                keys.append("set parallelism.recompute_granularity=full")
        budget = f"train.max_tokens_per_gpu ({t.max_tokens_per_gpu})" if t.use_dynamic_batch_size else \
            f"train.micro_batch_size ({t.micro_batch_size})"
        keys.append(f"lower {budget}")
    if p.sglang and p.engine is not None and p.engine.mem_fraction_static:
        keys.append(f"lower rollout.sglang.mem_fraction_static ({p.engine.mem_fraction_static})")
    if p.sglang and not (p.offload_train and p.offload_rollout) and cfg.cluster.colocate:
        keys.append("set cluster.offload_train=true cluster.offload_rollout=true")
    return "; ".join(keys)


# -- the table `slime-hydra plan` prints --------------------------------------------------------------------------------
def table(cfg: RunConfig) -> list[str]:
    device, source = device_memory(cfg.cluster)
    p = plan(cfg, device)
    where = f"{gib(device):.1f} GiB ({source})" if device is not None else f"unknown ({source})"
    lines = [f"memory: GiB per GPU (docs/memory.md); device {where}"]
    if p.train is not None:
        lines += train_lines(cfg, p.train)
    if p.engine is not None:
        lines += engine_lines(cfg, p.engine)
    for name, gpu in p.gpus.items():
        lines.append(gpu_line(name, gpu, device))
    if device is not None and p.sglang and "train + engine" in p.gpus:
        for ot, orl in ((False, False), (True, True)):
            if (ot, orl) != (p.offload_train, p.offload_rollout):
                other = plan(cfg, device, offload_train=ot, offload_rollout=orl).gpus["train + engine"]
                lines.append(gpu_line(f"  (with cluster.offload_train={str(ot).lower()} cluster.offload_rollout="
                                      f"{str(orl).lower()}) train + engine", other, device))
    return lines + offload_lines(cfg, p)


def train_lines(cfg: RunConfig, t: TrainMemory) -> list[str]:
    par, mg = cfg.parallelism, cfg.train.megatron
    optimizer = ("fp32 main params {:.2f}, Adam {:.2f}" if t.main_params else "Adam {1:.2f}").format(
        gib(t.main_params), gib(t.optimizer))
    sharded = " (split over data-parallel ranks)" if cfg.train.backend == "megatron" and par.use_distributed_optimizer else ""
    extra = (f", reference {gib(t.reference):.2f}" if t.reference else "") + (f", critic {gib(t.critic):.2f}" if t.critic else "")
    recompute = par.recompute_granularity or ("selective" if par.recompute_activations else "none")
    chunk = f", log-prob chunk {mg.log_probs_chunk_size}" if cfg.train.backend == "megatron" else ""
    return [f"  train rank: {t.params:,} parameters: weights {gib(t.weights):.2f}, gradients {gib(t.grads):.2f}, "
            f"{optimizer}{sharded}{extra} = state {gib(t.state):.2f} (built, before the first step: {gib(t.built):.2f})",
            f"    step: activations {gib(t.activations):.2f} per micro-batch of {t.tokens} tokens ({t.per_token_layer:,} "
            f"bytes per token and layer, recompute {recompute}{' x' + str(t.in_flight) + ' in flight' if t.in_flight > 1 else ''}), "
            f"log-prob pass {gib(t.logprob_pass):.2f}{chunk}, forward-only pass {gib(t.forward_pass):.2f}"
            + (f", foreach Adam {gib(t.optimizer_temps):.2f}" if t.optimizer_temps else "")
            + f" -> peak {gib(t.peak):.2f} (what perf/train_peak_allocated_gib measures)"]


def engine_lines(cfg: RunConfig, e: MP.EngineMemory) -> list[str]:
    r = cfg.rollout
    if r.backend != "sglang":
        return [f"  local engine (in the trainer's process): weights {gib(e.weights):.2f}, KV cache of one generation batch "
                f"{gib(e.local_kv):.2f}"]
    mfs = r.sglang.get("mem_fraction_static")
    frac = f"rollout.sglang.mem_fraction_static {mfs} of the free memory at its start" if mfs is not None else \
        "rollout.sglang.mem_fraction_static unset: SGLang picks, not planned here"
    return [f"  engine rank: weights {gib(e.weights):.2f} (engine TP {cfg.cluster.rollout_num_gpus_per_engine}), KV cache "
            f"{e.kv_per_token / 1024:.1f} KiB per token; {frac}"]


def gpu_line(name: str, g: Optional[MP.GpuMemory], device: Optional[int]) -> str:
    if g is None:
        return f"  {name} GPU: not planned (no device memory or mem_fraction_static to size the SGLang pool)"
    pool = ""
    if g.pool is not None:
        pool = f"; SGLang pool {gib(g.pool):.2f} of {gib(g.free_at_start):.2f} free at its start"
    verdict = "" if device is None else (": fits" if g.peak <= device else f": does NOT fit {gib(device):.1f}")
    return f"  {name} GPU: generating {gib(g.generate):.2f}, training {gib(g.train):.2f} -> peak {gib(g.peak):.2f}{verdict}{pool}"


def offload_lines(cfg: RunConfig, p: Plan) -> list[str]:
    c, r = cfg.cluster, cfg.rollout
    lines = []
    if r.backend == "sglang":
        mem = r.sglang.get("mem_fraction_static")
        lines.append(f"  rollout.sglang.mem_fraction_static: {mem if mem is not None else 'unset (sglang picks by GPU size)'}")
        if other := {k: v for k, v in r.sglang.items() if k != "mem_fraction_static"}:
            lines.append(f"  rollout.sglang (other server args): {other}")
    trainer = ("the trainer's weights, gradients and optimizer state wait in host memory while the engines generate, "
               "and the engines start beside a released trainer") if c.offload_train else "the trainer's memory stays resident"
    lines.append(f"  cluster.offload_train: {str(c.offload_train).lower()}: {trainer}")
    if r.backend == "sglang":
        what = ("the engines release their memory (KV cache and CUDA graphs; /release_memory_occupation) while the trainer "
                "trains and syncs, and resume it before they generate (skipped on CPU)") if c.offload_rollout \
            else "the engines keep their memory"
        if c.offload_rollout and not p.offload_rollout:
            what += "; rollout.sglang.enable_memory_saver=false: SGLang releases nothing"
        lines.append(f"  cluster.offload_rollout: {str(c.offload_rollout).lower()}: {what}")
    return lines
