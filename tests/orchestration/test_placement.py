"""The placement group's wait has a deadline. On the session's Ray cluster, another job holds every CPU that is
free, so the run's placement group (one bundle per CPU of the cluster: valid for its size, schedulable only when
nothing else holds a CPU) cannot be scheduled; create_placement_group gives up at cluster.placement_timeout_s with a
UserError (exit 2) naming the key, what it asked for and what is free, and removes the pending group instead of
leaving it queued."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group  # noqa: E402

from slime_hydra.config.schema import ClusterConfig  # noqa: E402
from slime_hydra.errors import UserError  # noqa: E402
from slime_hydra.orchestration import placement  # noqa: E402
from tests.support.servers import join_ray  # noqa: E402

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`


@pytest.fixture(scope="module")
def session_ray(ray_head):
    join_ray(ray_head, "placement", log_to_driver=False)
    yield
    ray.shutdown()


def test_placement_group_that_cannot_be_scheduled_fails_at_its_deadline_naming_the_key(session_ray):
    total = int(ray.cluster_resources()["CPU"])
    # holds every free CPU (other modules may hold the rest): a group of `total` bundles cannot be scheduled while it stands
    other_job = placement_group([{"CPU": 1}] * max(1, int(placement.free_resources().get("CPU", 0))), strategy="PACK")
    ray.get(other_job.ready(), timeout=120)
    try:
        c = ClusterConfig(backend="ray", device="cpu", actor_num_gpus_per_node=total, rollout_num_gpus=0,
                          placement_timeout_s=1.5)
        t0 = time.monotonic()
        with pytest.raises(UserError) as e:
            placement.create_placement_group(c, "a test cluster")
        took = time.monotonic() - t0
        assert 1.4 < took < 30, took
        msg = str(e.value)
        assert f"{total} bundle(s) of {{'CPU': 1.0}}" in msg and "was not scheduled within cluster.placement_timeout_s=1.5 s" in msg
        assert "raise cluster.placement_timeout_s" in msg and "(free now: {" in msg and "_group_" not in msg
        pending = [g for g in placement_group_table().values()
                   if g["state"] not in ("CREATED", "REMOVED") and len(g["bundles"]) == total]
        assert pending == [], pending  # the run's group was removed, not left in the queue
    finally:
        remove_placement_group(other_job)
