"""The session head's Ray workers fork from a warm interpreter (tests/support/ray_worker_zygote.py). A fork must be the
worker a cold start would have been, for every test that runs on the head: the same sys.path, environment and argv,
a process group of its own, registered with the raylet under its own pid; and it must not outlive the launcher
process the raylet started, or the raylet could no longer end it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from tests.support import ray_worker_zygote as Z
from tests.support.servers import join_ray

pytestmark = pytest.mark.integration


def _about_me():
    """What a worker can tell of itself: how it started and where it looks for modules."""
    watch = [t.name for t in threading.enumerate() if t.name.startswith(Z.WATCH_THREAD)]
    env = {k: v for k, v in os.environ.items() if k not in (*Z.PER_WORKER, Z.COLD_FLAG)}
    return {"pid": os.getpid(), "pgid": os.getpgid(0), "path": list(sys.path), "env": env, "script": sys.argv[0],
            "launcher": int(watch[0][len(Z.WATCH_THREAD):]) if watch else None}


def _actor(cold: bool):
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def about(self):
            return _about_me()

    opts = {"runtime_env": {"env_vars": {Z.COLD_FLAG: "1"}}} if cold else {}
    return Probe.options(**opts).remote()


def _launches(ray_head) -> tuple[int, int]:
    return Z.launch_counts(ray_head.temp_dir)


def test_a_forked_worker_is_the_worker_a_cold_start_gives(ray_head):
    import ray

    join_ray(ray_head, "ray_worker_zygote")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    before = _launches(ray_head)
    warm, cold = _actor(cold=False), _actor(cold=True)
    w, c = ray.get([warm.about.remote(), cold.about.remote()], timeout=180)
    after = _launches(ray_head)
    assert after[1] > before[1], (before, after)  # the cold one's launch (the warm one may take an idle fork)
    assert w["launcher"] is not None and c["launcher"] is None  # one forked, one started cold
    assert w["path"] == c["path"]
    assert w["env"] == c["env"]
    assert w["script"] == c["script"] and w["script"].endswith("default_worker.py")
    assert w["pgid"] == w["pid"] and c["pgid"] == c["pid"]  # each its own process group, as the raylet starts them
    ray.kill(warm)
    ray.kill(cold)


def test_a_fork_dies_with_its_launcher_and_ray_sees_the_actor_die(ray_head):
    import ray

    join_ray(ray_head, "ray_worker_zygote")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    probe = _actor(cold=False)
    me = ray.get(probe.about.remote(), timeout=180)
    assert me["launcher"] is not None
    os.kill(me["launcher"], signal.SIGKILL)  # as the raylet ends a worker that never registered
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{me['pid']}"):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{me['pid']}"), "the forked worker outlived its launcher"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(probe.about.remote(), timeout=60)
