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

from pathlib import Path
from typing import Optional

from slime_hydra.app.inputs import assemble, make_tracker, prepare
from slime_hydra.config.schema import RunConfig
from slime_hydra.engine.checkpoint import resume_hint
from slime_hydra.engine.components import Components
from slime_hydra.engine.state import restore
from slime_hydra.errors import UserError


def build_ray(cfg: RunConfig, output_dir: str, parent_run_id: Optional[str] = None) -> Components:
    # orchestration imports ray (~2 s, and a cluster's worth of threads): only for cluster.backend=ray
    from slime_hydra.orchestration import placement
    from slime_hydra.orchestration.calls import RayCalls
    from slime_hydra.orchestration.rollout_manager import RemoteRollout, RemoteSource, RolloutManager
    from slime_hydra.orchestration.train_group import TrainGroup

    if cfg.train.backend != "torch" or cfg.rollout.backend != "local":
        raise UserError(f"cluster.backend=ray drives train.backend=torch ranks and rollout.backend=local engines so far (got "
                        f"train.backend={cfg.train.backend}, rollout.backend={cfg.rollout.backend}); set cluster.backend=local")
    if cfg.algorithm.advantage_estimator == "ppo":
        raise UserError("algorithm.advantage_estimator=ppo: the critic's gradients are not all-reduced over data-parallel ranks "
                        "yet; set cluster.backend=local")
    inputs = prepare(cfg)  # data, hooks and the checkpoint to resume, before the cluster

    import ray

    started, where = placement.connect(cfg.cluster)
    pg = None
    try:
        pg, layout = placement.create_placement_group(cfg.cluster, where)
        tracker = make_tracker(cfg, inputs, output_dir, parent_run_id)
        uri = cfg.logger.tracking_uri if cfg.logger.tracker == "mlflow" else None
        save_dir = cfg.save or str(Path(output_dir) / "checkpoints")  # as app/session.py decides it
        calls = RayCalls(cfg.cluster.ray_call_timeout_s, lambda: resume_hint(save_dir))
        trainer = TrainGroup(pg, layout, cfg.cluster.num_threads, uri, tracker.run_id if uri else None, calls,
                             cfg.cluster.distributed_timeout_s)
        trainer.setup(inputs.model, cfg.algorithm, cfg.train, cfg.rollout.rollout_temperature,
                      cfg.num_rollout * cfg.train.num_steps_per_rollout, cfg.rollout.rollout_max_response_len, cfg.seed)
        manager = ray.remote(RolloutManager).options(num_cpus=0).remote(pg, layout, inputs.model, inputs.train_prompts, cfg.rollout, cfg.seed,
                                                                        cfg.cluster.num_threads, cfg.cluster.ray_call_timeout_s)

        def teardown() -> None:
            trainer.shutdown()
            placement.shutdown(pg, started)

        rollout = RemoteRollout(manager, calls, on_shutdown=teardown)
        comps = assemble(cfg, inputs, RemoteSource(manager, calls), trainer, rollout, tracker, output_dir)
    except BaseException:
        placement.shutdown(pg, started)
        raise
    if inputs.state is not None:
        restore(comps, inputs.state)
    return comps
