"""A graceful stop on SIGTERM / SIGINT (app/stop.py): a signal between two periodic checkpoints ends the run after its
step with a checkpoint, exit 143, its MLflow run KILLED and no process left, within stop_grace_s; a resume from that
checkpoint ends with the metrics of an uninterrupted run, bit for bit. A step longer than the grace, or a second
signal, is abandoned at once (exit 130 for SIGINT). The run's files are owner-only (private_files)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime_hydra.app.stop import processes
from slime_hydra.engine.checkpoint import load_state
from tests.support.runs import FAST, cli_env, mlflow_db, start_cli

pytestmark = pytest.mark.integration  # whole runs and processes that signal each other

PERF = "perf/"
RUN = [*FAST, "num_rollout=8", "save_interval=4", "eval=none", "warmstart=none",
       "+reward.custom_rm={_target_:tests.support.plugins.slow_reward,seconds:0.02}"]  # ~0.7 s a step


def cli(args: list[str], cwd: Path, **env: str):
    return start_cli(args, cwd, new_session=True, **env)


def sigterm_after_rollout(run, dump: Path) -> tuple[str, float]:
    """SIGTERM to the run's process group once `dump` (a rollout's debug dump) is written, between two periodic
    checkpoints: (its stderr, seconds from the signal to its exit)."""
    deadline = time.monotonic() + 600
    while not dump.is_file():
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sent = time.monotonic()
    os.killpg(run.pid, signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    return err, time.monotonic() - sent


def group_alive(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    return [p for p, fields in processes().items() if int(fields[2]) == pgid and fields[0] not in ("Z", "X")]


def history(root: Path) -> list[tuple[int, dict]]:
    return [(s, {k: v for k, v in m.items() if not k.startswith(PERF)}) for s, m in load_state(root / "rollout_000007")["history"]]


def test_sigterm_to_the_group_checkpoints_marks_killed_and_the_resume_is_exact(tmp_path):
    from mlflow.tracking import MlflowClient

    db = mlflow_db(tmp_path / "mlflow.db")
    full = cli([*RUN, "logger=none", f"hydra.run.dir={tmp_path}/full"], tmp_path)
    # rollout 5's samples are dumped after its training, before its save: the signal lands in rollout 5, after the
    # periodic checkpoint of rollout 4 and before the next (rollout 8)
    run = cli([*RUN, f"logger.tracking_uri={db}", f"hydra.run.dir={tmp_path}/run", f"save_debug_rollout_data={tmp_path}/dump"],
              tmp_path)
    root = tmp_path / "run" / "checkpoints"
    err, took = sigterm_after_rollout(run, tmp_path / "dump" / "rollout_000004.jsonl")
    assert run.returncode == 143, err[-3000:]
    assert took < 20, took  # stop_grace_s's default
    assert "stopped by SIGTERM after the step in progress, its checkpoint written" in err and "Traceback" not in err
    assert group_alive(run.pid) == []
    # written at the signal: rollout 5's, or the next one's if the signal came after rollout 5's check of it
    assert (root / "latest").read_text().strip() in ("rollout_000004", "rollout_000005", "rollout_000006")
    client = MlflowClient(db)
    (mlrun,) = client.search_runs([client.get_experiment_by_name("slime_hydra").experiment_id])
    assert mlrun.info.status == "KILLED"
    # private_files (on by default): the run directory is its user's only, and so is everything the run wrote in it
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    written = list((tmp_path / "run").rglob("*"))  # Hydra's .hydra/ and log (made before the run) among them
    assert written and all(f.stat().st_mode & 0o077 == 0 for f in written), [(f.name, oct(f.stat().st_mode)) for f in written]

    resumed = cli([*RUN, f"logger.tracking_uri={db}", f"load={root}", f"hydra.run.dir={tmp_path}/run2"], tmp_path)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    _, err = full.communicate(timeout=600)
    assert full.returncode == 0, err[-3000:]
    assert history(tmp_path / "run2" / "checkpoints") == history(tmp_path / "full" / "checkpoints")  # bit for bit
    assert client.get_run(mlrun.info.run_id).info.status == "FINISHED"  # the resume logged into the same run
    steps = [m.step for m in client.get_metric_history(mlrun.info.run_id, "rollout/reward_mean")]
    assert sorted(steps) == list(range(1, 9))  # each step once: saved before logged, so no duplicate after the resume


def test_the_same_stop_under_a_local_ray_cluster(tmp_path):
    """cluster.backend=ray, a local cluster the run starts: the group's SIGTERM reaches Ray's processes too, which leave
    it to the driver; the checkpoint at the signal is written through the train rank, and nothing is left. The cluster
    kept its files in a temp dir of its own, owner-only, under $RAY_TMPDIR."""
    import shutil
    import tempfile

    db = mlflow_db(tmp_path / "mlflow.db")
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths must fit in 107 bytes
    run = cli([*RUN, "cluster.backend=ray", "cluster.address=local", f"logger.tracking_uri={db}",
               f"hydra.run.dir={tmp_path}/run", f"save_debug_rollout_data={tmp_path}/dump"], tmp_path, RAY_TMPDIR=str(ray_tmp))
    err, took = sigterm_after_rollout(run, tmp_path / "dump" / "rollout_000004.jsonl")
    assert run.returncode == 143, err[-3000:]
    assert took < 20, took
    root = tmp_path / "run" / "checkpoints"
    assert (root / "latest").read_text().strip() in ("rollout_000004", "rollout_000005", "rollout_000006")
    assert load_state(root / (root / "latest").read_text().strip())["trainer"] is not None  # the rank's state came back
    end = time.monotonic() + 10  # Ray's last processes go as the driver's cluster shuts down
    while group_alive(run.pid) and time.monotonic() < end:
        time.sleep(0.2)
    assert group_alive(run.pid) == []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(db)
    (mlrun,) = client.search_runs([client.get_experiment_by_name("slime_hydra").experiment_id])
    assert mlrun.info.status == "KILLED"
    (own,) = ray_tmp.glob("ray-*")  # the run's own, not /tmp/ray shared with every user of the node
    assert own.stat().st_mode & 0o777 == 0o700 and list(own.glob("r/session_*"))
    shutil.rmtree(ray_tmp, ignore_errors=True)


STOPPER = """
import sys, time
from slime_hydra.app.stop import GracefulStop
with GracefulStop({grace}, lambda why: print("abandoned:", why, flush=True)) as stop:
    print("ready", flush=True)
    while True:  # a step that never ends
        time.sleep(0.01)
"""


@pytest.mark.parametrize("second", [False, True], ids=["grace_passes", "second_signal"])
def test_a_step_longer_than_the_grace_or_a_second_signal_is_abandoned_at_once(tmp_path, second):
    proc = subprocess.Popen([sys.executable, "-c", STOPPER.format(grace=30 if second else 1)], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    if second:
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - t0 < 10
    assert ("abandoned: a second signal (SIGINT)" if second else "abandoned: stop_grace_s=1 s passed") in out
    assert "SIGINT: finishing the current step" in err and "KeyboardInterrupt" not in err
