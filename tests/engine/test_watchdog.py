"""Nothing hangs silently: the stall watchdog and the custom reward's deadline.

The watchdog is tested in-process with a scripted step counter (deadlines derived by hand below) and through
the real CLI with a custom reward that never returns after rollout 2: exit 3, the message names the dump,
the keys and the last checkpoint, and the dump holds the hanging function's frame.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from slime_hydra.app.plugins import reward_scorer
from slime_hydra.config.schema import RewardConfig
from slime_hydra.engine.watchdog import StallWatchdog
from slime_hydra.errors import RunError, StallError
from slime_hydra.types import Sample
from tests.support.runs import FAST, ROOT, run_cli


def test_deadline_is_the_floor_or_factor_times_the_longest_recent_step(tmp_path):
    wd = StallWatchdog(lambda: 0, factor=4.0, min_timeout_s=10.0, dump_path=tmp_path / "d", resume_hint=str)
    assert wd.deadline_s([]) == 10.0  # no step time yet: the floor
    assert wd.deadline_s([1.0, 2.0]) == 10.0  # 4 x 2 = 8 < 10
    assert wd.deadline_s([1.0, 5.0, 2.0]) == 20.0  # 4 x 5
    # only the last 5 steps count: the 9 s step has left the window
    assert wd.deadline_s([9.0, 1.0, 1.0, 1.0, 1.0, 1.0]) == 10.0


def stuck_in_a_named_place(seconds: float) -> None:
    time.sleep(seconds)


def test_a_stalled_step_dumps_every_stack_and_interrupts_the_main_thread(tmp_path):
    steps = [0]

    def ticker():  # three steps 0.1 s apart, then nothing
        for _ in range(3):
            time.sleep(0.1)
            steps[0] += 1

    # deadline after the first step: max(0.5, 2 x longest(~0.1 s)) = 0.5 s
    wd = StallWatchdog(lambda: steps[0], factor=2.0, min_timeout_s=0.5, dump_path=tmp_path / "stall_stacks.txt",
                       resume_hint=lambda: "resume hint here", poll_s=0.02, grace_s=30)
    threading.Thread(target=ticker, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(StallError) as e, wd:
        stuck_in_a_named_place(30)
    took = time.monotonic() - t0
    assert 0.7 < took < 10, took  # 0.3 s of steps + 0.5 s deadline, not the 30 s sleep
    msg = str(e.value)
    for part in ("stall_min_timeout_s=0.5", "stall_timeout_factor=2", "stall_watchdog=false", "resume hint here",
                 str(tmp_path / "stall_stacks.txt")):
        assert part in msg, (part, msg)
    dump = (tmp_path / "stall_stacks.txt").read_text()
    assert "stuck_in_a_named_place" in dump and "stall-watchdog" in dump


def test_nothing_fires_before_the_first_step_or_while_steps_keep_coming(tmp_path):
    steps = [0]
    wd = StallWatchdog(lambda: steps[0], factor=2.0, min_timeout_s=0.3, dump_path=tmp_path / "d",
                       resume_hint=str, poll_s=0.02)
    with wd:
        time.sleep(0.8)  # start-up longer than the deadline: not armed yet
        for _ in range(8):  # steps of 0.1 s, each well inside 0.3 s
            steps[0] += 1
            time.sleep(0.1)
    assert wd.fired is None and not (tmp_path / "d").exists()


def hangs(sample, **kw):
    time.sleep(60)
    return 1.0


async def hangs_async(sample, **kw):
    await asyncio.sleep(60)
    return 1.0


@pytest.mark.parametrize("target", ["hangs", "hangs_async"])
def test_a_custom_reward_that_never_returns_fails_naming_the_key(target):
    scorer = reward_scorer(RewardConfig(custom_rm={"_target_": f"{__name__}.{target}"}, custom_rm_timeout_s=0.5))
    t0 = time.monotonic()
    with pytest.raises(RunError, match=r"did not return within reward.custom_rm_timeout_s=0.5 s for 2 samples"):
        scorer.score([Sample(prompt="p", response="r"), Sample(prompt="p", response="r")])
    assert time.monotonic() - t0 < 10


CALLS = {"n": 0}


def hangs_after_two_rollouts(sample, **kw):
    """8 prompts x 4 samples = 32 calls per rollout: the 65th call (rollout 3) never returns."""
    CALLS["n"] += 1
    if CALLS["n"] > 64:
        stuck_in_a_named_place(3600)
    return 0.0


@pytest.mark.integration
def test_cli_run_whose_reward_hangs_exits_3_with_the_stacks(workdir, monkeypatch):
    """The deadline is max(20 s, 3 x the longest step): a loaded CI machine's slow rollouts 1-2 (a few seconds
    each) must not fire it (at 4 s it once fired inside rollout 2), the hang in rollout 3 must."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the run imports the hook as tests.engine.test_watchdog
    r = run_cli([*FAST, "logger=none", "eval=none", "num_rollout=5", "save_interval=1", "+reward.custom_rm._target_=tests.engine.test_watchdog.hangs_after_two_rollouts",
                 "reward.custom_rm_timeout_s=3600", "stall_min_timeout_s=20", "stall_timeout_factor=3",
                 "output_dir=out"], workdir, timeout=300)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "stall: no rollout step finished in" in r.stderr and "stall_min_timeout_s=20" in r.stderr
    assert f"{workdir / 'out' / 'checkpoints' / 'rollout_000001'}: resume with load=" in r.stderr, r.stderr[-2000:]
    dump = (workdir / "out" / "stall_stacks.txt").read_text()
    assert "hangs_after_two_rollouts" in dump and "stuck_in_a_named_place" in dump


def test_watchdog_and_reward_deadlines_are_checked_before_anything_starts():
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        compose_run(["stall_timeout_factor=0", "stall_min_timeout_s=-1", "reward.custom_rm_timeout_s=0"])
    text = str(e.value)
    assert "3 config errors" in text
    assert "stall_timeout_factor=0.0 must be > 0; stall_watchdog=false switches the watchdog off" in text
    assert "stall_min_timeout_s=-1.0 must be > 0" in text and "reward.custom_rm_timeout_s=0.0 must be > 0" in text
    compose_run(["stall_watchdog=false"])


@pytest.mark.integration
def test_ray_run_whose_reward_hangs_dumps_every_actor_s_stacks(workdir, monkeypatch):
    """Under cluster.backend=ray the stall dump holds, after the driver's threads, every actor's stacks (the train
    rank, the rollout manager, its engine), each taken by SIGUSR2 through faulthandler (orchestration/stacks.py)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    r = run_cli([*FAST, "logger=none", "eval=none", "num_rollout=5", "save_interval=1", "cluster.backend=ray",
                 "+reward.custom_rm._target_=tests.engine.test_watchdog.hangs_after_two_rollouts", "reward.custom_rm_timeout_s=3600",
                 "stall_min_timeout_s=20", "stall_timeout_factor=3", "output_dir=out"], workdir, timeout=400)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert "stall: no rollout step finished in" in r.stderr, r.stderr[-3000:]
    dump = (workdir / "out" / "stall_stacks.txt").read_text()
    assert "hangs_after_two_rollouts" in dump and "=== other processes ===" in dump
    for label in ("train rank 0", "rollout manager", "rollout engine 0"):
        section = dump.split(f"--- {label} (pid ", 1)
        assert len(section) == 2, (label, dump[-3000:])
        assert "Thread 0x" in section[1].split("\n--- ", 1)[0] or "Current thread" in section[1], (label, section[1][:2000])
