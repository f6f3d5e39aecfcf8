"""The session head's Ray workers fork from a warm interpreter (tests/support/ray_worker_zygote.py). A fork must be the
worker a cold start would have been, for every test that runs on the head: the same sys.path, environment and argv,
a process group of its own, registered with the raylet under its own pid; and it must not outlive the launcher
process the raylet started, or the raylet could no longer end it."""

from __future__ import annotations

import json
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
    import ray

    return {"pid": os.getpid(), "pgid": os.getpgid(0), "path": list(sys.path), "env": env, "script": sys.argv[0],
            "launcher": int(watch[0][len(Z.WATCH_THREAD):]) if watch else None,
            "job": ray.get_runtime_context().get_job_id()}


def _actor(cold: bool):
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def about(self):
            return _about_me()

    opts = {"runtime_env": {"env_vars": {Z.COLD_FLAG: "1"}}} if cold else {}
    return Probe.options(**opts).remote()


def _probe_new_actor(actors: list, cold: bool = False) -> dict:
    """_about_me() from a new Probe actor, kept in `actors` for the test to kill."""
    import ray

    actors.append(_actor(cold))
    return ray.get(actors[-1].about.remote(), timeout=180)


def _launches(ray_head) -> tuple[int, int]:
    return Z.launch_counts(ray_head.temp_dir)


def _on_a_fork(call, deadline_s: float = 180.0):
    """`call()`'s result (a dict with the worker's `launcher`) from the first new worker that forked. A worker launched
    while its zygote still imports starts cold (no launch waits for a zygote), so the first few may be cold ones."""
    deadline = time.monotonic() + deadline_s
    while True:
        about = call()
        if about["launcher"] is not None or time.monotonic() > deadline:
            return about
        time.sleep(1.0)


def test_a_forked_worker_is_the_worker_a_cold_start_gives(ray_head):
    import ray

    join_ray(ray_head, "ray_worker_zygote")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    actors = []
    _on_a_fork(lambda: _probe_new_actor(actors))  # the zygote serves, started by this job or an earlier one
    join_ray(ray_head, "ray_worker_zygote")  # a job of its own: its forks must register as this job, not the zygote's
    actors.clear()
    w = _probe_new_actor(actors)
    before = _launches(ray_head)
    c = _probe_new_actor(actors, cold=True)
    after = _launches(ray_head)
    assert after[1] > before[1], (before, after)  # the cold one's launch (the warm one may take an idle fork)
    assert w["launcher"] is not None and c["launcher"] is None  # one forked, one started cold
    assert w["path"] == c["path"]
    assert w["env"] == c["env"]
    assert w["script"] == c["script"] and w["script"].endswith("default_worker.py")
    assert w["job"] == c["job"] == ray.get_runtime_context().get_job_id()
    assert Z.NIL_JOB_ID == ray.JobID.nil().hex()  # what each zygote imports Ray under
    assert w["pgid"] == w["pid"] and c["pgid"] == c["pid"]  # each its own process group, as the raylet starts them
    for actor in actors:
        ray.kill(actor)


def test_a_fork_dies_with_its_launcher_and_ray_sees_the_actor_die(ray_head):
    import ray

    join_ray(ray_head, "ray_worker_zygote")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    actors = []
    me = _on_a_fork(lambda: _probe_new_actor(actors))
    assert me["launcher"] is not None
    probe = actors[-1]  # the actor that answered
    os.kill(me["launcher"], signal.SIGKILL)  # as the raylet ends a worker that never registered
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{me['pid']}"):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{me['pid']}"), "the forked worker outlived its launcher"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(probe.about.remote(), timeout=60)


def _under_the_shim():
    """What a rank's worker has once its hook ran, and its sys.path once it imported the model code (as a rank does)."""
    import importlib

    import torch

    from tests.support.megatron_cpu import shim

    about = _about_me()
    imported = "slime_hydra.training.megatron.model" in sys.modules
    importlib.import_module("slime_hydra.training.megatron.model")
    return {"launcher": about["launcher"], "job": about["job"], "installed": shim._installed, "device": torch.empty(1, device="cuda").device.type,
            "model_imported": imported, "path": list(sys.path)}


def test_a_megatron_shim_job_forks_from_a_zygote_that_ran_its_hook(ray_head):
    """The jobs that install the megatron CPU shim in every worker (worker_process_setup_hook) fork from a zygote that
    ran the hook and imported megatron-core and the model code: a fork is then what a cold worker is once its hook ran."""
    import ray

    from tests.support.megatron_cpu.ray_ranks import SHIM_HOOK
    from tests.support.runs import ROOT

    def join():
        join_ray(ray_head, "ray_worker_zygote_shim", worker_process_setup_hook=SHIM_HOOK,
                 env_vars={"PYTHONPATH": str(ROOT)})
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        return ray.remote(num_cpus=0, max_calls=1)(_under_the_shim)  # max_calls: each call on a new worker

    probe = join()
    _on_a_fork(lambda: ray.get(probe.remote(), timeout=180))  # the zygote serves, started by this job or an earlier one
    probe = join()  # a job of its own: its forks must register as this job, not as the one that started the zygote
    warm = ray.get(probe.remote(), timeout=180)
    cold = ray.get(probe.options(runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), Z.COLD_FLAG: "1"},
                                              "worker_process_setup_hook": SHIM_HOOK}).remote(), timeout=180)
    assert warm["launcher"] is not None and cold["launcher"] is None
    assert warm["job"] == cold["job"] == ray.get_runtime_context().get_job_id()
    assert warm["installed"] and cold["installed"] and warm["device"] == cold["device"] == "cpu"
    assert warm["model_imported"] and not cold["model_imported"]  # what the fork saves: megatron's import
    assert warm["path"] == cold["path"], (warm["path"], cold["path"])


FAKE_WORKER = """import json, os, sys
with open(sys.argv[1], "w") as f:
    json.dump({"pid": os.getpid(), "ray_imported": "ray" in sys.modules}, f)
"""


def test_no_launch_waits_for_a_starting_zygote_and_one_zygote_starts(tmp_path):
    """Launches that find no zygote serving start their worker cold at once and leave one zygote starting in the
    background: a raylet gives a worker 60 s to register, and a zygote's imports on a loaded machine can take longer.
    Once it serves, the next launch forks from it. The worker here is a stand-in script named default_worker.py, launched
    as a raylet launches one: the launcher script with the worker's argv."""
    import subprocess

    (tmp_path / "default_worker.py").write_text(FAKE_WORKER)
    zdir = tmp_path / "zygotes"
    zdir.mkdir()
    launcher = Z.launcher_script(str(zdir), owner=os.getpid())
    env = {k: v for k, v in os.environ.items() if k != Z.COLD_FLAG}

    def launch(name: str) -> subprocess.Popen:
        return subprocess.Popen([launcher, str(tmp_path / "default_worker.py"), str(tmp_path / name)], env=env)

    try:
        first = [launch(f"cold{i}.json") for i in range(3)]
        assert [p.wait(timeout=60) for p in first] == [0, 0, 0]
        outs = [json.loads((tmp_path / f"cold{i}.json").read_text()) for i in range(3)]
        assert not any(o["ray_imported"] for o in outs)  # cold: a fresh interpreter ran the script
        assert Z.launch_counts(str(zdir)) == (0, 3)
        logs = [p for p in zdir.iterdir() if p.name.endswith(".sock.log")]
        assert len(logs) == 1 and set(logs[0].read_text().splitlines()) == {"cold the zygote is starting"}
        sock = str(logs[0])[:-len(".log")]
        deadline = time.monotonic() + 180
        while not os.path.exists(sock) and time.monotonic() < deadline:
            assert not os.path.exists(sock + ".failed"), open(sock + ".zygote.log").read()
            time.sleep(0.2)
        assert os.path.exists(sock), "the zygote did not serve within 180 s"
        assert launch("warm.json").wait(timeout=60) == 0
        warm = json.loads((tmp_path / "warm.json").read_text())
        assert warm["ray_imported"]  # forked from the zygote, which imported Ray
        assert Z.launch_counts(str(zdir)) == (1, 3)
        serving = [line for line in open(sock + ".zygote.log").read().splitlines() if " serving " in line]
        assert len(serving) == 1, serving  # three launches at once started one zygote
    finally:
        Z.stop_zygotes(str(zdir))
