"""The placement group's wait has a deadline. Another job holds every CPU of a real local Ray cluster,
so the run's placement group (valid for the cluster's size) cannot be scheduled; create_placement_group gives up
at cluster.placement_timeout_s with a UserError (exit 2) naming the key, what it asked for and what is free, and
removes the pending group instead of leaving it queued."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group  # noqa: E402

from slime_hydra.config.schema import ClusterConfig  # noqa: E402
from slime_hydra.errors import UserError  # noqa: E402
from slime_hydra.orchestration import placement  # noqa: E402


@pytest.fixture(scope="module")
def two_cpu_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


def test_placement_group_that_cannot_be_scheduled_fails_at_its_deadline_naming_the_key(two_cpu_ray):
    other_job = placement_group([{"CPU": 1}] * 2, strategy="PACK")  # holds both CPUs
    ray.get(other_job.ready(), timeout=60)
    try:
        c = ClusterConfig(backend="ray", device="cpu", actor_num_gpus_per_node=2, rollout_num_gpus=2,
                          placement_timeout_s=1.5)
        t0 = time.monotonic()
        with pytest.raises(UserError) as e:
            placement.create_placement_group(c, "a test cluster")
        took = time.monotonic() - t0
        assert 1.4 < took < 30, took
        msg = str(e.value)
        assert "2 bundle(s) of {'CPU': 1.0}" in msg and "was not scheduled within cluster.placement_timeout_s=1.5 s" in msg
        assert "raise cluster.placement_timeout_s" in msg and "(free now: {" in msg and "_group_" not in msg
        pending = [g for g in placement_group_table().values() if g["state"] not in ("CREATED", "REMOVED")]
        assert pending == [], pending  # the run's group was removed, not left in the queue
    finally:
        remove_placement_group(other_job)
