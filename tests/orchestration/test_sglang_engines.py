"""rollout.backend=sglang under cluster.backend=ray: real SGLang servers on CPU, each owned by a Ray actor.

One short GRPO run (1 torch train rank + 1 engine, disaggregated: weights over a gloo update group the train rank
opens and broadcasts on; the driver neither opens a group nor fetches the weights) on the session's real
`ray start --head` cluster (one CPU bundle each). The server is the engine actor's child; every weight sync is
checked equal (`check_weight_update_equal`); a server killed mid-rollout is relaunched through its actor and resynced
over a new group; after shutdown no server process is left. First, on its
own: the same run colocated (the rank and the engine share one bundle), its weights sent from the rank.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time

import pytest

from slime_hydra.app.preflight import compose_run
from slime_hydra.types import SamplingParams, Status
from tests.support import ray_worker_zygote
from tests.support.runs import FAST
from tests.support.servers import join_ray

pytestmark = [pytest.mark.sglang, pytest.mark.integration]

EXPERIMENT = "experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1"
ARGS = [EXPERIMENT, *FAST, "logger=none", "eval=none", "num_rollout=2", "cluster.backend=ray", "cluster.colocate=false",
        "cluster.rollout_num_gpus=1", "rollout.check_weight_update_equal=true", "rollout.use_fault_tolerance=true",
        "rollout.rollout_health_check_interval=1", "rollout.rollout_health_check_first_wait=600",
        "rollout.sglang.max_total_tokens=16384",
        # (first wait: an engine start took 3m45s on the loaded 2-core VM, a relaunch was killed at 120 s)
        # one engine: while it restarts (minutes on a loaded CPU) the router has no worker; requests wait it out
        "rollout.sglang_max_retries=60"]


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_colocated_engine_gets_the_weights_from_the_rank_on_its_bundle(ray_head, external_router, tmp_path):
    """cluster.colocate=true: 1 torch rank and 1 engine on one bundle; each sync's handles come from the rank's own
    tensors (orchestration/rank_weights.py: shared-memory files on CPU), not from the driver. 2 rollouts, each sync
    checked equal on the rank; the engine is checked once more here against rank 0's weights through the object store.
    The router is one already running (rollout.sglang_router_ip/port: the test process's shared router): the engine
    its Ray actor started is registered with it, with the run's key, and removed at shutdown.
    Runs before the module's disaggregated run."""
    import httpx
    import ray

    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop
    from slime_hydra.orchestration.rank_weights import RankWeights
    from slime_hydra.rollout.sglang import weights as W

    join_ray(ray_head, "sglang_engines")
    cfg = compose_run([a for a in ARGS if a != "cluster.colocate=false"] + ["cluster.colocate=true", *external_router.overrides])
    router = external_router.endpoint
    c = build(cfg, str(tmp_path))
    try:
        r = c.rollout
        assert r.mode == "tensor" and r.group.launcher.layout.engine_bundles == ((0,),)
        workers = httpx.get(router.url + "/workers", headers=router.headers, timeout=30).json()["workers"]
        assert [w["url"] for w in workers] == [r.group.engines[0].url] and r.group.router is None
        history = loop.run(loop_settings(cfg), c, str(tmp_path / "ckpt"))
        assert [m["rollout/weight_version"] for _, m in history if "rollout/weight_version" in m] == [0.0, 1.0]
        assert r.weight_version == 2 == r.synced_version
        assert isinstance(r._last_weights, RankWeights) and r._last_weights.engine_ranks == [[[0]]]
        named = list(c.trainer.named_weights())  # iterated: rank 0's, through the object store
        (e,) = r.group.engines
        assert W.check_equal(e.endpoint, named, cfg.model.dtype, 60) == len(named)
    finally:
        c.rollout.shutdown()
        ray.shutdown()
    assert httpx.get(router.url + "/workers", headers=router.headers, timeout=30).json()["workers"] == []


@pytest.fixture(scope="module")
def ray_run(ray_head, tmp_path_factory):
    import ray

    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    # workers start cold: one forked from the tier's warm interpreter has torch imported already, which the engine
    # actor's check below must see it leave out
    join_ray(ray_head, "sglang_engines", env_vars={ray_worker_zygote.COLD_FLAG: "1"})
    out = tmp_path_factory.mktemp("ray_sglang")
    cfg = compose_run(ARGS)
    c = build(cfg, str(out))
    try:
        with fetches_counted(c.trainer) as fetched:
            history = loop.run(loop_settings(cfg), c, str(out / "ckpt"))
        assert fetched == [], "the driver fetched the weights from the object store during the run"
        yield cfg, c, history
    finally:
        c.rollout.shutdown()
        ray.shutdown()


@contextlib.contextmanager
def fetches_counted(trainer):
    """The train group's object-store route (rank 0's weights to the driver), counted: one entry per call."""
    calls: list[int] = []
    fetch = trainer._in_object_store
    trainer._in_object_store = lambda: calls.append(1) or fetch()
    try:
        yield calls
    finally:
        trainer._in_object_store = fetch


def rank_update_groups(rank) -> dict[int, str]:
    """engine index -> the name of the update group this train rank actor opened for it (RankStage's own)."""
    import ray

    names = lambda self: {e: g.pg_name for e, g in (self._update_groups.groups if self._update_groups else {}).items()}  # noqa: E731
    return ray.get(rank.__ray_call__.remote(names), timeout=60)


def imported_in(actor, modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` the actor's worker process has imported."""
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: [m for m in modules if m in sys.modules]), timeout=60)


def test_run_on_an_engine_actor_syncs_every_weight_update_equal(ray_run):
    from slime_hydra.orchestration.rank_weights import RankWeights
    from slime_hydra.orchestration.sglang_engines import RayLauncher, RemoteServer
    from slime_hydra.rollout.sglang import weights as W

    cfg, c, history = ray_run
    r = c.rollout
    assert r.mode == "distributed" and isinstance(r.group.launcher, RayLauncher)
    (e,) = r.group.engines
    assert isinstance(e.process, RemoteServer) and e.process.alive()
    assert ppid(e.process.pid) == r.group.launcher.actor_pids[0] != os.getpid()  # the actor's child, not the driver's
    # the actor only owns the server's process: after the whole run its worker has not imported torch
    assert imported_in(r.group.launcher.actors[0], ("torch", "transformers", "sglang")) == []
    # the weights went from the rank over the group it opened (gloo): the driver opened none and fetched nothing
    assert isinstance(r._last_weights, RankWeights) and r._last_weights.feeders == [[0]] and r._groups == {}
    assert list(rank_update_groups(c.trainer.ranks[0])) == [0]
    assert rank_update_groups(c.trainer.ranks[0])[0].startswith("slime_hydra_engine0_launch1_")
    # rollout k is generated by the weights synced after rollout k-1; each sync was checked equal (or the run raised)
    assert [m["rollout/weight_version"] for _, m in history if "rollout/weight_version" in m] == [0.0, 1.0]
    assert r.weight_version == 2 and r.synced_version == 2  # two syncs, after rollouts 0 and 1
    named = list(c.trainer.named_weights())  # rank 0's, through the object store
    assert W.check_equal(e.endpoint, named, cfg.model.dtype, 60) == len(named)


def test_killed_server_is_relaunched_through_its_actor_and_resynced(ray_run):
    import httpx

    from slime_hydra.rollout.sglang import weights as W

    cfg, c, _ = ray_run
    r = c.rollout
    (e,) = r.group.engines
    actor_pid, old = r.group.launcher.actor_pids[0], e.process.pid
    before = rank_update_groups(c.trainer.ranks[0])[0]
    samples = [s for g in c.source.next_groups(16) for s in g]
    sp = SamplingParams(1.0, 1.0, -1, 48, ())  # no stop token: long enough that the kill lands mid-rollout
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("samples", asyncio.run(r.generate(samples, sp))))
    worker.start()
    time.sleep(1.0)
    os.killpg(old, signal.SIGKILL)  # the server and its scheduler: a crash
    worker.join(timeout=400)
    assert not worker.is_alive()
    got = out["samples"]
    assert len(got) == 16 * 4 and len({(s.group_index, s.index) for s in got}) == 16 * 4
    assert all(s.status in (Status.COMPLETED, Status.TRUNCATED) and s.response_length >= 1 for s in got)
    # the monitor relaunches it: until it has seen the death, `healthy` is still the old server's (a rollout that ended
    # before the kill lands returns with the flag set and nothing relaunched yet)
    deadline = time.monotonic() + 240
    while not (e.launches == 2 and e.healthy.is_set()):
        assert time.monotonic() < deadline, e.process.log_tail()
        time.sleep(0.2)
    assert e.restarts == 1 and e.launches == 2
    assert e.process.pid != old and ppid(e.process.pid) == actor_pid == r.group.launcher.actor_pids[0]  # the same actor
    # resynced by the rank over a new group (the relaunched server has none of the old one's state)
    after = rank_update_groups(c.trainer.ranks[0])[0]
    assert after.startswith("slime_hydra_engine0_launch2_") and before.startswith("slime_hydra_engine0_launch1_"), (before, after)
    assert r._groups == {}
    named = list(c.trainer.named_weights())
    assert W.check_equal(e.endpoint, named, cfg.model.dtype, 60) == len(named)  # resynced before it served again
    body = {"input_ids": [10, 11, 12], "sampling_params": {"max_new_tokens": 2}}
    assert httpx.post(e.url + "/generate", json=body, headers=e.endpoint.headers, timeout=60).json()["meta_info"]["weight_version"] == str(r.weight_version)


def test_shutdown_leaves_no_server_process(ray_run):
    import ray

    _, c, _ = ray_run
    r = c.rollout
    (e,) = r.group.engines
    server, actor_pid = e.process.pid, r.group.launcher.actor_pids[0]
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == server]
    assert len(children) >= 2  # the server's process group: launch_server, its scheduler (and detokenizer)
    r.shutdown()
    deadline = time.monotonic() + 30
    while not all(gone(p) for p in [*children, actor_pid]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert all(gone(p) for p in children), [p for p in children if not gone(p)]
    assert gone(actor_pid)
    # the run's one placement group (the engine's bundle and the train rank's) is removed; other modules' may stand
    assert ray.util.placement_group_table(r.group.launcher.pg)["state"] == "REMOVED"


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1
