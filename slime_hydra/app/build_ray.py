"""`cluster.backend=ray`: the run's components as Ray actors in one placement group (slime's driver).

The order is slime's: data and configs are checked first, then the cluster is joined and the layout
checked against what it holds (a clear error, exit code 2, before any actor or model is built), then
the placement group, the train group and the rollout manager. The result is the same `Components`
the in-process build returns, so `engine/loop.py` runs unchanged on either. A custom generate hook
(multi-turn agents) runs in the driver, over the manager's engines, exactly as it runs over an
in-process engine. Every wait on an actor has the deadline `cluster.ray_call_timeout_s` and names its step,
the key and the checkpoint to resume from (orchestration/calls.py). What it shares with the local
builder (data, tokenizer, resume, the Components' assembly) is app/inputs.py.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Optional

from slime_hydra.app.algorithm import run_specs
from slime_hydra.app.inputs import assemble, build_source, make_tracker, prepare
from slime_hydra.app.plugins import load_target
from slime_hydra.config.schema import RunConfig
from slime_hydra.engine.checkpoint import resume_hint
from slime_hydra.engine.components import Components, restore
from slime_hydra.engine.offload import trainer_released
from slime_hydra.protocols import PromptSource, RolloutBackend
from slime_hydra.training.specs import AlgorithmSpecs


def build_ray(cfg: RunConfig, output_dir: str, parent_run_id: Optional[str] = None) -> Components:
    # orchestration imports ray (~2 s, and a cluster's worth of threads): only for cluster.backend=ray
    from slime_hydra.orchestration import placement, stacks
    from slime_hydra.orchestration.calls import RayCalls
    from slime_hydra.orchestration.rollout_manager import RemoteRollout, start_rollout_manager

    inputs = prepare(cfg)  # data, hooks and the checkpoint to resume, before the cluster
    specs = run_specs(cfg)  # names turned into the trainer's and the advantage step's callables

    started, where = placement.connect(cfg.cluster)
    pg = None
    try:
        pg, layout = placement.create_placement_group(cfg.cluster, where)
        tracker = make_tracker(cfg, inputs, output_dir, parent_run_id)
        uri = cfg.logger.tracking_uri if cfg.logger.tracker == "mlflow" else None
        save_dir = cfg.save or str(Path(output_dir) / "checkpoints")  # as app/session.py decides it
        calls = RayCalls(cfg.cluster.ray_call_timeout_s, lambda: resume_hint(save_dir))
        trainer = build_train_group(cfg, specs, inputs.model, pg, layout, calls, uri, tracker.run_id if uri else None)

        def teardown() -> None:
            trainer.shutdown()
            placement.shutdown(pg, started)

        manager: Optional[RemoteRollout] = None
        if cfg.rollout.backend == "sglang":  # engines owned by Ray actors; the router, client and prompt source here
            rollout: RolloutBackend = sglang_rollout(cfg, pg, layout, trainer, inputs.tokenizer, calls, output_dir, teardown)
            source: PromptSource = build_source(cfg, inputs.tokenizer, inputs.train_prompts)
        else:  # local engines behind a rollout manager actor, which owns the prompt source
            manager, source = start_rollout_manager(pg, layout, inputs.model, inputs.train_prompts, cfg.rollout, cfg.seed,
                                                    cfg.cluster.num_threads, calls, on_shutdown=teardown)
            rollout = manager
            if cfg.data.data_source:  # the user's source serves from the driver (slime's lives in its rollout manager)
                source = build_source(cfg, inputs.tokenizer, inputs.train_prompts)
        comps = assemble(cfg, inputs, source, trainer, rollout, tracker, specs.advantage, output_dir)
        if cfg.stall_watchdog:  # a stall dumps every actor's stacks too, beside the driver's
            where = str((Path(output_dir) / "actor_stacks").resolve())  # the actors' working directory is not ours
            procs = trainer.register_stacks(where)
            if manager is not None:
                procs += manager.register_stacks(where)
            comps.more_stacks = functools.partial(stacks.collect, procs)
    except BaseException:
        placement.shutdown(pg, started)
        raise
    if inputs.state is not None:
        restore(comps, inputs.state)
    return comps


def build_train_group(cfg: RunConfig, specs: AlgorithmSpecs, model_cfg, pg, layout, calls, tracking_uri: Optional[str],
                      run_id: Optional[str]):
    """The train ranks of `train.backend`, set up: torch data-parallel ranks (the driver splits each batch) or megatron
    ranks (TP/PP/DP from `parallelism`; every rank takes the whole batch)."""
    from slime_hydra.orchestration.megatron_group import MegatronTrainGroup
    from slime_hydra.orchestration.train_group import TrainGroup
    from slime_hydra.rollout.sglang.sources import route_of  # with the groups: its weight senders import httpx

    c, temperature = cfg.cluster, cfg.rollout.rollout_temperature
    # the route the SGLang engines take the weights by, which the ranks serve themselves; local engines: the object store
    route = route_of(cfg.rollout.weight_sync, c.colocate) if cfg.rollout.backend == "sglang" else None
    if cfg.train.backend == "megatron":
        group = MegatronTrainGroup(pg, layout, c.num_threads, calls, c.distributed_timeout_s, route)
        group.setup(model_cfg, cfg.parallelism, specs, cfg.train.megatron, temperature, cfg.seed)
        return group
    group = TrainGroup(pg, layout, c.num_threads, tracking_uri, run_id, calls, c.distributed_timeout_s, route)
    group.setup(model_cfg, specs, temperature, cfg.seed)
    return group


def sglang_rollout(cfg: RunConfig, pg, layout, trainer, tokenizer, calls, output_dir: str,
                   on_shutdown: Callable[[], None]) -> RolloutBackend:
    """`rollout.backend=sglang` under Ray: each engine's server started by an actor on its bundle
    (orchestration/sglang_engines.py), the router, client, weight sync and health monitor in this process."""
    from slime_hydra.app.sglang_attach import sglang_attachments
    from slime_hydra.orchestration.sglang_engines import RayLauncher, RaySGLangRollout, SaveThroughRank0
    from slime_hydra.rollout.sglang.sources import TENSOR, route_of

    c = cfg.cluster
    offload = c.offload_rollout if c.offload_rollout is not None else c.colocate
    driver_node_only = None  # the ranks send from every node; handles from the driver's memory open on its node only
    if route_of(cfg.rollout.weight_sync, c.colocate) == TENSOR and trainer.engine_ranks is None:
        driver_node_only = ("rollout.weight_sync=tensor posts handles to the driver's memory where the train ranks cannot "
                            "(an engine without a rank of every pipeline stage on its node, or engines not colocated); set "
                            "rollout.weight_sync=distributed, or cluster.actor_num_nodes=1 on a one-node cluster")
    released = bool(c.offload_train)  # the engines start beside a released trainer (docs/memory.md)
    return RaySGLangRollout(cfg.rollout, SaveThroughRank0(trainer, tokenizer), tokenizer, num_engines=len(layout.engine_bundles),
                            tp_size=c.rollout_num_gpus_per_engine, seed=cfg.seed, dtype=cfg.model.dtype,
                            output_dir=output_dir, colocate=c.colocate, offload=offload,
                            device="cuda" if layout.use_gpu else "cpu", launcher=RayLauncher(pg, layout, calls, driver_node_only),
                            on_shutdown=on_shutdown, starting=functools.partial(trainer_released, trainer, released),
                            keep_on_host=released, post_write=load_target(cfg.rollout.custom_update_weight_post_write),
                            **sglang_attachments(cfg.rollout))
