"""Megatron ranks placed as a run places them (orchestration/megatron_group.py: one Ray actor per rank on the session's
cluster) and driven directly, without the engine loop or a rollout: the tests join the cluster with the CPU shim
installed in every worker of their job, then call the group's TrainBackend methods, or one method on every rank."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from tests.support.megatron_cpu import shim
from tests.support.servers import RayHead, join_ray

SHIM_HOOK = "tests.support.megatron_cpu.shim.install"


def join_with_shim(head: RayHead, namespace: str) -> None:
    """This process joins `head` as a job in `namespace`; every worker process of the job (the ranks, a rollout manager,
    its engines) installs the CPU shim first, and this process too (its single-process runs are the references)."""
    shim.install()
    # the hook is imported in each worker: the repository root on its path (pytest puts it on this process's only)
    root = str(Path(__file__).resolve().parents[3])
    join_ray(head, namespace, worker_process_setup_hook=SHIM_HOOK, env_vars={"PYTHONPATH": root})


@contextlib.contextmanager
def megatron_group(cfg, timeout_s: float = 900.0) -> Iterator[Any]:
    """The ranks of a composed Ray config (cluster.actor_num_gpus_per_node of them, one thread each), not set up yet
    (setup); shut down and their placement group removed on exit."""
    from ray.util.placement_group import placement_group, remove_placement_group

    from slime_hydra.orchestration.calls import RayCalls
    from slime_hydra.orchestration.megatron_group import MegatronTrainGroup
    from slime_hydra.orchestration.placement import plan_layout

    lay = plan_layout(cfg.cluster, False)
    pg = placement_group([lay.bundle] * lay.num_bundles)
    group = None
    try:
        group = MegatronTrainGroup(pg, lay, 1, RayCalls(timeout_s), cfg.cluster.distributed_timeout_s)
        yield group
    finally:
        if group is not None:
            group.shutdown()
        remove_placement_group(pg)


def setup(group, cfg, total_steps: int, max_response_len: int, seed: int) -> None:
    """As app/build_ray.py sets the ranks up: the model the seed builds, cfg.parallelism, the specs of cfg.algorithm and
    cfg.train (`total_steps`: the lr schedule's horizon). Again on the same ranks: a fresh trainer in the same processes
    (their process group kept, megatron's groups built anew), as a single process builds a second backend."""
    from slime_hydra.app.algorithm import algorithm_specs

    group.setup(cfg.model, cfg.parallelism, algorithm_specs(cfg.algorithm, cfg.train, total_steps, max_response_len),
                cfg.train.megatron, 1.0, seed)


def every_rank(group, name: str, *args: Any) -> list:
    """The trainer's `name` on every rank (a collective, as the group calls it), each rank's answer: the group hands
    the driver rank 0's."""
    import ray

    refs = [ray.put(a) for a in args]  # one copy in the object store for all ranks
    return group.calls.get([r.call.remote(name, *refs) for r in group.ranks], name, group.labels)
