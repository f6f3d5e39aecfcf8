"""The stall watchdog's view into Ray actors: a real actor stuck in C code (time.sleep holds no Python frame
that could answer a Ray call) is signalled and its stack, naming the function it is stuck in, comes back."""

from __future__ import annotations

import sys
import time

import pytest
import ray

from slime_hydra.orchestration.stacks import ActorProcess, collect, register
from tests.support.servers import join_ray

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`


@pytest.fixture
def local_ray(ray_head):
    join_ray(ray_head, "stacks", log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the worker cannot import this test module
    yield
    ray.shutdown()


class Stuck:
    def start(self, directory: str) -> ActorProcess:
        return register("train rank 1", directory)

    def wait_for_a_collective_that_never_ends(self) -> None:
        time.sleep(3600)


def test_a_stuck_actor_s_stack_is_collected(local_ray, tmp_path):
    actor = ray.remote(Stuck).options(num_cpus=0, max_concurrency=1).remote()
    proc = ray.get(actor.start.remote(str(tmp_path)), timeout=60)
    actor.wait_for_a_collective_that_never_ends.remote()
    time.sleep(2)  # the call is running (and the actor cannot answer another one)
    gone = ActorProcess("rollout manager", proc.host, 2**22 + 12345, str(tmp_path / "gone.txt"))  # no such pid
    away = ActorProcess("rank 9", "another-node", 1, "/tmp/x.txt")
    t0 = time.monotonic()
    text = collect([proc, gone, away], deadline_s=10)
    assert time.monotonic() - t0 < 10
    assert f"--- train rank 1 (pid {proc.pid}" in text
    assert "wait_for_a_collective_that_never_ends" in text and "test_stacks.py" in text  # the stuck frame
    assert "rollout manager (pid" in text and "not signalled" in text
    assert "rank 9 (pid 1 on another-node): not signalled from" in text and "/tmp/x.txt" in text
    ray.kill(actor)
