"""Every check of a typed RunConfig, after derivation: the config's own (config/checks.py), then each component's.

`check(given)` derives (app/derive.py) and then only reads. A component's checks live beside it and receive only
the groups they read: the estimator's (algorithms/checks.py, from its row of the estimator table), the model's
(models/checks.py), each trainer's (training/checks.py, training/megatron/checks.py), each rollout engine's
(rollout/sglang/checks.py), each cluster backend's (orchestration/checks.py), the generate hook's, the
rewards' and the tracker's. This is the one place that knows which components a run uses. Nothing here imports a backend
(megatron, sglang, ray; the memory plan, app/memory.py, asks the GPU driver for the device's memory where
cluster.gpu_memory_gb is unset); every problem is collected, so the user sees them all at once.
"""

from __future__ import annotations

import os

from slime_hydra.agent.hook import check_hooks
from slime_hydra.algorithms import checks as estimator_checks
from slime_hydra.app import memory
from slime_hydra.app.derive import derive, model_context
from slime_hydra.config import checks as config_checks
from slime_hydra.config.datafiles import eval_datasets
from slime_hydra.config.schema import RunConfig
from slime_hydra.engine.rollout_hooks import check_rollout_hooks
from slime_hydra.errors import Missing
from slime_hydra.models import checks as model_checks
from slime_hydra.orchestration import checks as cluster_checks
from slime_hydra.orchestration.checks import NOT_YET
from slime_hydra.rewards import checks as reward_checks
from slime_hydra.rollout.sglang import checks as sglang_checks
from slime_hydra.tracking import checks as tracker_checks
from slime_hydra.training import checks as torch_checks
from slime_hydra.training.megatron import checks as megatron_checks


def check(given: RunConfig) -> tuple[RunConfig, list[str], list[str]]:
    """(the derived config, every problem, notes about derivations and warnings). `given` is not changed."""
    cfg, notes = derive(given)
    problems, more = config_checks.check(cfg, given_num_rollout=given.num_rollout)
    notes += more
    more, more_notes = estimator_checks.check(cfg.algorithm, cfg.rollout.n_samples_per_prompt, cfg.num_rollout)
    problems, notes = problems + more, notes + more_notes
    problems += model_checks.check(cfg.model) + model_checks.check_model_impl(cfg.model)
    more, more_notes = model_checks.check_learning_rate(cfg.model, cfg.train, cfg.load)
    problems, notes = problems + more, notes + more_notes
    problems += train_checks(cfg, notes)
    problems += check_hooks(cfg.rollout.custom_generate, cfg.rollout.generate_hooks)
    problems += check_rollout_hooks(cfg.rollout)
    problems += check_prompt_room(cfg)
    rm_types = {"reward.rm_type": cfg.reward.rm_type}
    rm_types |= {f"eval.eval_prompt_data.{n}.rm_type": d.rm_type for n, d in eval_datasets(cfg).items()}
    problems += reward_checks.check(cfg.reward, rm_types)
    problems += tracker_checks.check(cfg.logger, os.environ)
    if cfg.rollout.backend == "sglang":  # reads sglang's sources with ast, imports nothing
        problems += sglang_checks.check(cfg.rollout, cfg.cluster)
    problems += sglang_checks.check_post_write(cfg.rollout, cfg.cluster)
    problems += sglang_checks.check_external(cfg.rollout, cfg.cluster)
    problems += sglang_checks.check_external_router(cfg.rollout)
    problems += cluster_checks.check_local_only(cfg.cluster, cfg.data.streaming, cfg.load_debug_rollout_data,
                                                cfg.debug_rollout_only)
    more, more_notes = cluster_checks.check(cfg.cluster, cfg.rollout.backend, cfg.train, cfg.parallelism)
    problems, notes = problems + more, notes + more_notes
    problems += cluster_checks.check_ray_sglang(cfg.cluster, cfg.train.backend, cfg.rollout, cfg.parallelism)
    problems += memory.offload_problems(cfg)
    # the memory plan reads a consistent config (batch identity, layout): only paths absent here or a pairing the Ray
    # engine does not drive yet may be pending
    if all(isinstance(p, Missing) or p.startswith(NOT_YET) for p in problems):
        more, more_notes = memory.check(cfg)
        problems, notes = problems + more, notes + more_notes
    return cfg, problems, notes


def train_checks(cfg: RunConfig, notes: list[str]) -> list[str]:
    """The chosen trainer's checks (notes appended to `notes`); the other trainer's keys must be left alone."""
    if cfg.train.backend == "megatron":
        return (megatron_checks.check(cfg.model, cfg.parallelism, cfg.train, cfg.cluster.device, cfg.load)
                + megatron_checks.check_batching(cfg.train, cfg.parallelism, cfg.model)
                + megatron_checks.check_layout(cfg.parallelism, cfg.cluster))
    problems = model_checks.check_checkpoint(cfg.model) + megatron_checks.check_unused(cfg.train)
    if cfg.train.backend == "torch":  # (another name is refused with the schema's choices)
        notes += torch_checks.half_precision_notes(cfg.model, cfg.train)
        problems += torch_checks.check(cfg.parallelism)
    return problems


def check_prompt_room(cfg: RunConfig) -> list[str]:
    """A prompt and its response fit the model's context (app/derive.py derives the prompt limit when unset)."""
    context, source = model_context(cfg)
    response, limit = cfg.rollout.rollout_max_response_len, cfg.data.rollout_max_prompt_len
    if context is None:
        return []
    room = context - response
    if room < 1:
        return [f"rollout.rollout_max_response_len={response} leaves no room for a prompt in the model's context {context} "
                f"({source}); lower it"]
    if limit is not None and limit > room:
        return [f"data.rollout_max_prompt_len={limit} is over the model's context {context} ({source}) - "
                f"rollout.rollout_max_response_len={response} = {room}: a longer prompt fails mid-run; set "
                f"data.rollout_max_prompt_len<={room}, or null to take {room}"]
    return []
