"""Megatron-format checkpoints (megatron.core.dist_checkpointing): model + optimizer, any TP/PP/DP layout.

Every rank writes its shards into `<path>/.megatron.partial/`; once all have finished, rank 0
renames it to `<path>/megatron/` (a crash mid-save leaves any earlier `megatron/` intact). The
tensors are stored by their global shape and offsets (megatron's ShardedTensors), so a checkpoint
written with TP=2 loads with TP=1 and vice versa. The distributed optimizer's state is written in
megatron's dp_reshardable format, which reloads under another DP size and the same TP/PP layout (under
the CPU shim a DP=2 checkpoint resumed with DP=1 matches the uninterrupted DP=2 run to 3e-6, the
DP=2-vs-DP=1 summation difference; same layout: bit-exact) once _restore_adam_steps works around
megatron-core 0.16.1's step handling with torch's Adam; its fully_reshardable format fails to load
with torch's Adam (KeyError 'step', distrib_optimizer.py:940). A checkpoint loads only into the
optimizer kind that wrote it (distributed or not: different keys); check_loadable says so, naming
parallelism.use_distributed_optimizer, before anything is read. Scalars (optimizer step counts, the
backend's own counters, the optimizer layout) go into the common part. PPO's critic (model and optimizer) is saved
with them, its keys prefixed `critic.`. bf16 / fp16 models: the optimizer's fp32
main params and Adam moments are saved beside the model's bf16 weights (resumes are bit-exact, tests/training/megatron/test_backend.py),
which needs every model parameter in the model dtype (model.cast_parameters). Left out: asynchronous saving (megatron's
async_sharded_save) and any lookahead for a shared filesystem's consistency: ranks of one job are
assumed to see the same directory, as megatron's own checkpointing assumes.
"""

from __future__ import annotations

import os
import queue
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
from megatron.core.dist_checkpointing.mapping import ShardedBase

DIRNAME = "megatron"
_OPT_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _sharded(model, optimizer, ref, is_loading: bool, critic=None) -> dict:
    sd = {"model": model.sharded_state_dict()}
    sd["optimizer"] = optimizer.sharded_state_dict(sd["model"], is_loading=is_loading, metadata=_OPT_METADATA)
    if ref is not None:  # the KL reference: same layout as the policy, its own key prefix
        sd["ref_model"] = ref.sharded_state_dict(prefix="ref_model.")
    if critic is not None:  # ppo's value model and its optimizer: the same two parts under "critic."
        c_model, c_opt = critic
        part = {"model": c_model.sharded_state_dict()}
        part["optimizer"] = c_opt.sharded_state_dict(part["model"], is_loading=is_loading, metadata=_OPT_METADATA)
        sd["critic"] = _prefixed(part, CRITIC_PREFIX)
    return sd


CRITIC_PREFIX = "critic."


def _prefixed(sd: dict, prefix: str) -> dict:
    """Every sharded entry's checkpoint key with `prefix`: the distributed optimizer names its buckets without the model's
    prefix (`optimizer.distributed.dp_group_idx_0...`), so the critic's optimizer would collide with the policy's."""
    seen: set[int] = set()

    def add(v):
        if isinstance(v, ShardedBase) and id(v) not in seen:
            seen.add(id(v))
            v.key = prefix + v.key
        return v

    return dict_list_map_inplace(add, sd)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _write_results_in_process() -> None:
    """megatron's torch_dist writer returns its write results through a queue of a multiprocessing Manager it spawns
    at a process's first save (filesystem_async._get_write_results_queue): a fresh interpreter per rank, which imports
    the rank's __main__ again (a Ray worker's, the CLI's) for seconds of CPU, then idles until the rank ends. It serves
    megatron's asynchronous save, whose writer runs in another process; a synchronous save, the only kind made here,
    fills and reads that queue in the rank's own process (the writer's forked children report over a queue of their
    own), so a thread queue serves it. megatron-core 0.16.1's name; another version without it keeps its own queue."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", "absent") is None:
        filesystem_async._results_queue = queue.Queue()


def save(path: str | Path, model, optimizer, ref=None, extra: dict | None = None, critic=None) -> Path:
    """Collective: every rank calls it with its own shards (critic: ppo's (model, optimizer)). Returns `<path>/megatron`."""
    root = Path(path)
    final, tmp = root / DIRNAME, root / f".{DIRNAME}.partial"
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    sd = _sharded(model, optimizer, ref, is_loading=False, critic=critic)
    sd["extra"] = dict(extra or {})
    sd["optimizer_layout"] = _optimizer_layout(optimizer)
    sd["parts"] = {"critic": critic is not None}  # check_loadable: a PPO run resumes only from a checkpoint with one
    _write_results_in_process()
    dist_checkpointing.save(sd, str(tmp), content_metadata=_OPT_METADATA)
    _barrier()
    if rank0:
        if final.exists():
            old = root / f".{DIRNAME}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    _barrier()
    return final


def exists(path: str | Path) -> bool:
    return (Path(path) / DIRNAME / "metadata.json").is_file()


def _init_distributed_optimizer_state(optimizer) -> None:
    """megatron-core 0.16.1 with torch's Adam (no Apex / TE): DistributedOptimizer.sharded_state_dict(is_loading=True)
    calls state_dict(), which asserts one shared 'step' over the parameters' states, before any state exists
    (distrib_optimizer.py:642). Zero states with step 0 make the assertion hold; the checkpoint overwrites them."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not isinstance(opt, DistributedOptimizer):
            continue
        for group in opt.optimizer.param_groups:
            for p in group["params"]:
                state = opt.optimizer.state[p]
                if not state:
                    state.update(exp_avg=torch.zeros_like(p.data), exp_avg_sq=torch.zeros_like(p.data), step=torch.tensor(0.0))


def _restore_adam_steps(optimizer) -> None:
    """megatron-core 0.16.1 with torch's Adam, two bugs of DistributedOptimizer.load_state_dict (any DP size):
    - it gives every parameter's state the SAME 'step' tensor (one torch.tensor for all), so each optimizer step adds
      1 per parameter to it (34 per step on the tiny model) and Adam's bias correction goes wrong;
    - load_parameter_state_from_dp_reshardable then copies into it the 'step' that sharded_state_dict(is_loading=True)
      captured before loading (a LocalNonpersistentObject: the placeholder 0 of _init_distributed_optimizer_state).
    Together they made a resumed run's next update differ (what looked like a DP=2 -> DP=1 resharding error). The
    param groups hold the saved step: each parameter gets its own tensor of it."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if not isinstance(opt, DistributedOptimizer):
            continue
        for group in opt.optimizer.param_groups:
            if "step" not in group:
                continue
            for p in group["params"]:
                state = opt.optimizer.state.get(p)
                if state and "step" in state:
                    state["step"] = state["step"].clone().fill_(float(group["step"]))  # own tensor, dtype and device kept


def _optimizer_layout(optimizer) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    chain = getattr(optimizer, "chained_optimizers", [optimizer])
    return {"use_distributed_optimizer": any(isinstance(o, DistributedOptimizer) for o in chain),
            "data_parallel_size": ps.get_data_parallel_world_size()}


def check_loadable(ckpt: Path, optimizer, critic: bool = False) -> None:
    """The two optimizers store different keys (the distributed one by grad-buffer bucket, the other by parameter):
    a checkpoint loads only into the kind that wrote it. The DP size may differ (dp_reshardable; exact: tests). A PPO
    run (critic) needs a checkpoint with a critic (those written before the `parts` entry are not checked)."""
    from slime_hydra.errors import ConfigError
    from slime_hydra.training.critic import no_critic_in
    from slime_hydra.training.megatron.checks import optimizer_kind_mismatch

    common = dist_checkpointing.load_common_state_dict(str(ckpt)) or {}
    now = _optimizer_layout(optimizer)
    problems = [p for p in [optimizer_kind_mismatch(common.get("optimizer_layout"), now["use_distributed_optimizer"], str(ckpt),
                                                    f"; now {now['data_parallel_size']}")] if p]
    if critic and common.get("parts", {}).get("critic") is False:
        problems.append(no_critic_in(str(ckpt.parent)))
    if problems:
        raise ConfigError(problems)


def load(path: str | Path, model, optimizer, ref=None, critic=None) -> dict:
    """Collective: fills model, optimizer (ref, and the critic's (model, optimizer)) in place from `<path>/megatron`;
    returns `extra`."""
    ckpt = Path(path) / DIRNAME
    check_loadable(ckpt, optimizer, critic is not None)
    pairs = [(model, optimizer)] + ([critic] if critic is not None else [])
    for _, opt in pairs:
        _init_distributed_optimizer_state(opt)
    sd = _sharded(model, optimizer, ref, is_loading=True, critic=critic)  # `extra` comes from the checkpoint's common part
    state = dist_checkpointing.load(sd, str(ckpt))
    parts = [state] + ([state["critic"]] if critic is not None else [])
    for (m, opt), part in zip(pairs, parts):
        m.load_state_dict(part["model"])
        with torch.no_grad():  # the distributed optimizer copies into its main params, leaves that require grad
            opt.load_state_dict(part["optimizer"])
            _restore_adam_steps(opt)
    if ref is not None:
        ref.load_state_dict({k.removeprefix("ref_model."): v for k, v in state["ref_model"].items()})
    return state.get("extra") or {}
