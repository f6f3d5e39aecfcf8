"""Every blocking step has a deadline, so a lost peer fails the run instead of hanging it: Ray actor calls,
torch.distributed, the async rollout queue.

Real parts throughout: a local Ray cluster (2 CPUs, no dashboard) with actors that sleep past the timeout or are
killed with SIGKILL; the real train group (2 gloo ranks of the tiny model) with one rank left alone in an
all-reduce and the other killed; real in-process async runs whose custom reward hangs or exits in the rollout
worker. Each failure must be a RunError naming the step, the key and where to resume, within the timeout plus a
few seconds (bounds below are generous for a loaded 2-core machine).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time

import pytest
import ray

from slime_hydra.errors import RunError
from slime_hydra.orchestration.calls import RayCalls, get, outer_timeout_s
from tests.support.runs import FAST
from tests.support.servers import join_ray

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`

SLACK_S = 8.0  # scheduling and RPC latency allowed beyond a deadline on a loaded machine


@pytest.fixture(scope="module")
def local_ray(ray_head):
    """The session's cluster, in this module's namespace."""
    import sys

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Sleeper travels by value: workers cannot import tests
    join_ray(ray_head, "timeouts", log_to_driver=False)
    yield
    ray.shutdown()


class Sleeper:
    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def fail_with_run_error(self) -> None:
        raise RunError("rollout generate on rollout engine 1 did not finish within cluster.ray_call_timeout_s=5 s")

    def fail_with_bug(self) -> None:
        raise ValueError("a bug in actor code")


def sleepers(n: int) -> list:
    actors = [ray.remote(Sleeper).options(num_cpus=0).remote() for _ in range(n)]
    get([a.pid.remote() for a in actors], "start", 120.0)  # started before any clock below runs
    return actors


def test_call_past_its_timeout_names_the_step_the_actor_and_the_key(local_ray):
    a, b = sleepers(2)
    t0 = time.monotonic()
    with pytest.raises(RunError) as e:
        get([a.sleep.remote(0.1), b.sleep.remote(60)], "train step", 2.0, ["rank 0", "rank 1"],
            resume_hint=lambda: "The last checkpoint is X: resume with load=Y.")
    waited = time.monotonic() - t0
    msg = str(e.value)
    assert 2.0 <= waited < 2.0 + SLACK_S, waited
    assert msg.startswith("train step on rank 1 did not finish within cluster.ray_call_timeout_s=2 s (1 of 2 finished)")
    assert "Raise cluster.ray_call_timeout_s" in msg and msg.endswith("resume with load=Y.")
    t0 = time.monotonic()  # a shutdown call the busy actor cannot answer: bounded by the timeout, and never raised
    RayCalls(1.0).shutdown(b.sleep.remote(1), "train shutdown", ["rank 1"])
    assert time.monotonic() - t0 < 1.0 + SLACK_S
    ray.kill(b)
    # the driver's wait on an actor that itself waits with the same timeout is longer: 3600 + 5 + 60, 10 + 5 + 1
    assert outer_timeout_s(3600) == 3665 and outer_timeout_s(10) == 16


def test_actor_killed_with_sigkill_is_named_at_once(local_ray):
    a, b = sleepers(2)
    calls = RayCalls(60.0, lambda: "The last checkpoint is X.")
    pid_b = get(b.pid.remote(), "pid", 60.0)  # asked first: the actor runs one call at a time
    refs = [a.sleep.remote(60), b.sleep.remote(60)]
    threading.Timer(1.0, os.kill, (pid_b, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(RunError) as e:
        calls.get(refs, "train step", ["rank 0", "rank 1"])
    waited = time.monotonic() - t0
    msg = str(e.value)
    assert waited < 1.0 + SLACK_S, waited  # not the 60 s rank 0 still sleeps, nor the 60 s timeout
    assert msg.startswith("train step on rank 1: the actor died: The actor is dead because its worker process has died")
    assert f"(pid {pid_b})" in msg and msg.endswith("The last checkpoint is X.")
    ray.kill(a)


def test_run_error_raised_in_an_actor_arrives_as_its_message_other_errors_unchanged(local_ray):
    (a,) = sleepers(1)
    calls = RayCalls(30.0, lambda: "Resume hint.")
    with pytest.raises(RunError) as e:
        calls.get(a.fail_with_run_error.remote(), "rollout generate", ["the rollout manager"], nested=True)
    assert str(e.value) == ("rollout generate on rollout engine 1 did not finish within cluster.ray_call_timeout_s=5 s "
                            "Resume hint.")
    with pytest.raises(ValueError, match="a bug in actor code"):  # a bug keeps its remote traceback
        calls.get(a.fail_with_bug.remote(), "step", ["x"])
    ray.kill(a)


def test_async_call_past_its_timeout(local_ray):
    from slime_hydra.aio import run_sync

    (a,) = sleepers(1)
    calls = RayCalls(1.5, lambda: "Hint.")
    t0 = time.monotonic()
    with pytest.raises(RunError, match=r"^rollout generate on the rollout manager did not finish within "
                                       r"cluster.ray_call_timeout_s=1.5 s: .* Hint\.$"):
        run_sync(calls.get_async(a.sleep.remote(60), "rollout generate", "the rollout manager"))
    assert time.monotonic() - t0 < 1.5 + SLACK_S
    ray.kill(a)


def wait_dead(actor, within_s: float = 60.0) -> None:
    """ray.kill returns before the actor is gone: a call sent at once may still run, and fail with its own error
    (its peer's closed gloo pair) rather than the death. Waits until a call to the actor fails as a dead actor's."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the killed actor still answered after {within_s:g} s")


def test_train_group_collective_timeout_and_a_dead_rank(local_ray):
    """2 gloo ranks with cluster.distributed_timeout_s=3: rank 0 alone in the step's first all-reduce gives up after
    3 s and the driver reports it; with rank 1 killed, the next train step names rank 1; shutdown still returns."""
    import dataclasses

    from ray.util.placement_group import placement_group, remove_placement_group

    from slime_hydra.app.algorithm import algorithm_specs
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.orchestration.placement import plan_layout
    from slime_hydra.orchestration.train_group import TrainGroup, split_for_ranks
    from tests.support.tiny import random_batch

    cfg = compose_run(FAST + ["num_rollout=1"])
    lay = plan_layout(dataclasses.replace(cfg.cluster, backend="ray", actor_num_gpus_per_node=2, rollout_num_gpus=2), False)
    pg = placement_group([lay.bundle] * lay.num_bundles)
    try:
        group = TrainGroup(pg, lay, 1, None, None, RayCalls(120.0, lambda: "Hint."), distributed_timeout_s=3.0)
        group.setup(cfg.model, algorithm_specs(cfg.algorithm, cfg.train, 1, cfg.rollout.rollout_max_response_len), 1.0, cfg.seed)
        batch = random_batch(32, 10, 40, seed=0)
        part0 = split_for_ranks(batch, group.num_steps, 2)[0]
        t0 = time.monotonic()
        with pytest.raises(RunError) as e:
            group.calls.get([group.ranks[0].train_rollout.remote(part0)], "train step", ["rank 0"])
        waited = time.monotonic() - t0
        assert 3.0 <= waited < 3.0 + SLACK_S, waited
        assert str(e.value).startswith("all-reduce of the step's loss denominator on rank 0 did not complete within "
                                       "cluster.distributed_timeout_s=3 s (")
        assert "raise cluster.distributed_timeout_s if it is only slow. Hint." in str(e.value)

        ray.kill(group.ranks[1])
        wait_dead(group.ranks[1])
        with pytest.raises(RunError, match=r"^train step on rank 1: the actor died: The actor is dead because it was "
                                           r"killed by `ray.kill`\..* Hint\.$"):
            group.train_rollout(batch)
        t0 = time.monotonic()
        group.shutdown()  # rank 1 does not answer: bounded, and not raised over the error that ended the run
        assert time.monotonic() - t0 < SLACK_S
    finally:
        remove_placement_group(pg)


def test_process_group_creation_past_its_timeout():
    """Rank 0 of 2 waits for a rank 1 that never comes: RunError after cluster.distributed_timeout_s (gloo store).
    In a fresh interpreter: init_process_group is a no-op where a group exists, as one may in this pytest process
    (the megatron tests create one)."""
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import time, torch\n"
        "from slime_hydra.errors import RunError\n"
        "from slime_hydra.training.distributed import init_process_group\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        f"    init_process_group(0, 2, 'tcp://127.0.0.1:{port}', torch.device('cpu'), 2.0)\n"
        "except RunError as e:\n"
        "    print('RUNERROR', time.monotonic() - t0, str(e))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RUNERROR ")), None)
    assert line is not None, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    _, took, msg = line.split(" ", 2)
    assert re.match(rf"creating the process group \(tcp://127.0.0.1:{port}, 2 ranks\) on rank 0 did not complete "
                    r"within cluster.distributed_timeout_s=2 s \(", msg), msg
    assert float(took) < 2.0 + SLACK_S


def test_joining_an_address_nothing_answers_at_fails_fast():
    """ray.init(address=<dead host:port>) retries for many minutes (measured: still retrying after 5 min); the probe
    before it fails at once on a refused port, and within cluster.placement_timeout_s on a silent one."""
    from slime_hydra.errors import UserError
    from slime_hydra.orchestration.placement import probe_gcs

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: refused
    t0 = time.monotonic()
    with pytest.raises(UserError, match=rf"^cluster.address=127.0.0.1:{port}: no Ray cluster answers there within "
                                        r"cluster.placement_timeout_s=5 s \(Connection refused\); start one with"):
        probe_gcs(f"127.0.0.1:{port}", 5.0)
    assert time.monotonic() - t0 < 2.0
    with socket.socket() as s:  # a listening port passes
        s.bind(("127.0.0.1", 0))
        s.listen()
        probe_gcs(f"127.0.0.1:{s.getsockname()[1]}", 5.0)


def test_timeout_keys_must_be_positive():
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        compose_run(["cluster.ray_call_timeout_s=0", "cluster.distributed_timeout_s=-1", "async_rollout_timeout_s=0"])
    text = str(e.value)
    for p in ("cluster.ray_call_timeout_s=0.0 must be > 0 (seconds)", "cluster.distributed_timeout_s=-1.0 must be > 0",
              "async_rollout_timeout_s=0.0 must be > 0 (seconds)"):
        assert p in text, text


# -- the async rollout queue -------------------------------------------------------------------------------------
CALLS = {"n": 0, "mode": ""}
HANG = threading.Event()  # set at the end of a test: the hung reward returns and its thread ends


def fails_in_rollout_2(sample, **kw):
    """8 prompts x 4 samples = 32 calls per rollout: the 65th call (the first of rollout 2) hangs or exits."""
    CALLS["n"] += 1
    if CALLS["n"] > 64:
        if CALLS["mode"] == "hang":
            HANG.wait(120)
            raise RuntimeError("released")  # ends this thread's loop over the group: no calls leak into the next test
        raise SystemExit(7)
    return 0.0


def async_run(tmp_path, mode: str):
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.app.session import run_session

    CALLS.update(n=0, mode=mode)
    HANG.clear()
    args = FAST + ["logger=none", "eval=none", "train_mode=async", "num_rollout=4", "save_interval=1",
                   f"+reward.custom_rm._target_={__name__}.fails_in_rollout_2", "reward.custom_rm_timeout_s=3600",
                   "stall_watchdog=false", "async_rollout_timeout_s=3"]
    t0 = time.monotonic()
    try:
        with pytest.raises(RunError) as e:
            run_session(compose_run(args), str(tmp_path / "out"), args)
    finally:
        HANG.set()
    return str(e.value), time.monotonic() - t0


def test_async_generation_that_hangs_stops_the_run_naming_the_rollout_and_key(tmp_path):
    """Rollout 2 hangs in its reward (generated ahead while rollout 1 trains); the save after step 2 drains the
    queue and waits on it: RunError 3 s after rollout 2's generation started, naming the checkpoint of step 1."""
    msg, took = async_run(tmp_path, "hang")
    assert msg.startswith("async rollout queue: rollout 2 (generated ahead by the rollout worker thread) did not "
                          "finish within async_rollout_timeout_s=3 s of the start of its generation; the worker is in "
                          "call_with_deadline (rewards/compute.py:")  # the sync custom reward's wait: where it hangs
    assert "Raise async_rollout_timeout_s if generation is only slow." in msg
    ckpt = tmp_path / "out" / "checkpoints"
    assert msg.endswith(f"The last checkpoint is {ckpt.resolve() / 'rollout_000000'}: resume with load={ckpt.resolve()}.")
    assert took < 60, took  # build + 2 rollouts + the 3 s deadline, not the 120 s hang


def test_async_worker_thread_that_ends_stops_the_run(tmp_path):
    msg, _ = async_run(tmp_path, "exit")
    assert msg.startswith("async rollout queue: the rollout worker thread ended on SystemExit(7) while generating "
                          "rollout 2."), msg
    assert "rollout_000000: resume with load=" in msg
