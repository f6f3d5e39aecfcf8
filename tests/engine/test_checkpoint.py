"""Checkpoints under faults: real `slime-hydra` processes SIGKILLed mid-run and mid-save, a real full disk, broken files.

Every killed run is resumed from its save root (load=<save>, `latest`) and must end where an uninterrupted
run of the same config ends: every metric of every rollout (perf/ timings aside) and every weight bit-identical
on CPU. The kill-during-save cases slow each os.fsync down (tests/support/fault_hooks/sitecustomize.py) so a save of
this tiny model lasts long enough to be killed inside; the run is otherwise the unchanged CLI. The random-moment
case prints its seed (SLIME_HYDRA_FAULT_SEED=<seed> repeats its choice of moment; the timing around it is the
machine's). The full disk is a 1.5-checkpoint tmpfs where mounting is allowed (root), else the in-process case
raises ENOSPC from the writer itself.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from slime_hydra.engine.checkpoint import CheckpointError, load_state, resolve_checkpoint, save_checkpoint
from tests.support.crafted import crafted_state
from tests.support.runs import FAST, cli_env, run_cli, start_cli

HOOKS = str(Path(__file__).resolve().parents[1] / "support" / "fault_hooks")
ARGS = FAST + ["logger=none", "num_rollout=6", "save_interval=2", "seed=7", "eval=none"]  # checkpoints 1, 3, 5
FINAL = "rollout_000005"
SEED = int(os.environ.get("SLIME_HYDRA_FAULT_SEED") or time.time_ns() % 2**31)


# ------------------------------------------------------------------------------------ real runs of the CLI


def start(work: Path, name: str, extra: list[str], fsync_delay_s: float = 0.0, fsync_hang_on: str = ""):
    """The CLI started in its own session (killpg reaches only it), its output appended to work/<name>.log. With the
    fault hooks it starts in a fresh interpreter (their sitecustomize runs at start-up); otherwise it may fork warm."""
    hooks = {}
    if fsync_delay_s or fsync_hang_on:
        hooks = {"PYTHONPATH": os.pathsep.join([HOOKS, cli_env()["PYTHONPATH"]]),
                 "SLIME_HYDRA_TEST_FSYNC_DELAY_S": str(fsync_delay_s), "SLIME_HYDRA_TEST_FSYNC_HANG_ON": fsync_hang_on}
    return start_cli([*ARGS, f"hydra.run.dir={work}/{name}", *extra], work, new_session=True, log=work / f"{name}.log",
                     **hooks)


def output(work: Path, name: str) -> str:
    return (work / f"{name}.log").read_text()


def finish(proc: subprocess.Popen, work: Path, name: str, rc: int = 0, timeout: float = 240) -> str:
    proc.wait(timeout=timeout)
    text = output(work, name)
    assert proc.returncode == rc, text[-3000:]
    return text


def kill_when(proc: subprocess.Popen, work: Path, name: str, ready, what: str, deadline_s: float = 180,
              then_s: float = 0.0) -> None:
    """SIGKILL the run (its whole process group) once `ready()` holds, `then_s` seconds later."""
    deadline = time.monotonic() + deadline_s
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}:\n{output(work, name)[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {deadline_s} s"
        time.sleep(0.002)
    time.sleep(then_s)
    with contextlib.suppress(ProcessLookupError):  # a run forked warm that ended meanwhile is reaped, its group gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def latest(root: Path) -> str | None:
    try:
        return (root / "latest").read_text().strip()
    except FileNotFoundError:
        return None


def partial(root: Path, name: str) -> list[Path]:
    return sorted(root.glob(f".{name}.tmp-*"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run; started at once, waited for at first use, so it overlaps the first victim."""
    work = tmp_path_factory.mktemp("ckpt_faults")
    proc = start(work, "ref", [f"save={work}/ref_ckpt"])

    def result() -> Path:
        if proc.returncode is None:
            finish(proc, work, "ref")
        return work / "ref_ckpt"

    yield work, result
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)


def assert_same_run(got_root: Path, ref_root: Path, how: str = "") -> None:
    """Every rollout's metrics (timings aside) and every weight of the final checkpoint, bit for bit."""
    got, ref = load_state(got_root / FINAL)["history"], load_state(ref_root / FINAL)["history"]
    assert [s for s, _ in got] == [s for s, _ in ref] == [1, 2, 3, 4, 5, 6]
    for (step, a), (_, b) in zip(got, ref):
        keys = sorted(k for k in b if not k.startswith("perf/"))
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, f"rollout {step} differs from the uninterrupted run{how}"
    w_got, w_ref = load_file(got_root / FINAL / "model.safetensors"), load_file(ref_root / FINAL / "model.safetensors")
    assert w_got.keys() == w_ref.keys() and all(torch.equal(w_got[k], w_ref[k]) for k in w_ref), how


@pytest.mark.integration
def test_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(reference):
    """SIGKILL inside the save of rollout_000003 (its .tmp directory exists): rollout_000003 never appears, `latest`
    still names rollout_000001, and the resume from the save root ends bit-identical to the uninterrupted run."""
    work, ref = reference
    root, rng = work / "a_ckpt", random.Random(SEED)
    victim = start(work, "a", [f"save={root}"], fsync_delay_s=0.1)  # ~10 fsyncs a save: >= 1 s inside it
    then = rng.uniform(0, 0.8)
    kill_when(victim, work, "a", lambda: bool(partial(root, "rollout_000003")), "save of rollout_000003", then_s=then)
    assert not (root / "rollout_000003").exists(), f"killed {then:.2f} s into the save (seed {SEED}): it had finished"
    assert latest(root) == "rollout_000001" and partial(root, "rollout_000003")
    text = finish(start(work, "a", [f"save={root}", f"load={root}"]), work, "a")
    assert "skipped" not in text and "not resuming" not in text  # rollout_000001 loads; nothing else was published
    assert not list(root.glob(".*.tmp-*")), "the killed save's temporary directory is removed by the next save"
    assert_same_run(root, ref())


@pytest.mark.integration
def test_killed_between_publishing_and_latest_resumes_from_latest(reference):
    """SIGKILL after rollout_000003 was renamed into place but before `latest` moved to it: the resume takes what
    `latest` names (rollout_000001), warns that rollout_000003 was not taken, and ends bit-identical."""
    work, ref = reference
    root = work / "b_ckpt"
    victim = start(work, "b", [f"save={root}"], fsync_delay_s=0.3)  # the save root's fsync and latest's: 0.6 s
    kill_when(victim, work, "b", lambda: (root / "rollout_000003").is_dir() and latest(root) == "rollout_000001",
              "window between publishing rollout_000003 and updating latest")
    assert latest(root) == "rollout_000001", "the kill came after latest moved; the window was missed"
    text = finish(start(work, "b", [f"save={root}", f"load={root}"]), work, "b")
    assert "not resuming from rollout_000003, newer than `latest` (rollout_000001)" in text
    assert_same_run(root, ref())


@pytest.mark.integration
def test_killed_at_a_random_moment_resumes_exactly(reference):
    """SIGKILL at a random moment after the first checkpoint (generating, training, saving, between), no slowdown."""
    work, ref = reference
    rng = random.Random(SEED + 1)
    # the moment: uniform over the uninterrupted run's time from its first checkpoint to its last (1.1-2.0 s measured
    # beside a running tier), not a fixed span the run may finish inside. A victim that ran faster than the reference
    # and finished first is not a kill: the next victim's moment comes from that victim's own span.
    span = (ref() / FINAL).stat().st_mtime - (ref() / "rollout_000001").stat().st_mtime
    tried = []
    for name in ("c", "c2", "c3"):
        root = work / f"{name}_ckpt"
        victim = start(work, name, [f"save={root}"])
        then = rng.uniform(0, span)
        kill_when(victim, work, name, lambda: latest(root) is not None, "first checkpoint", then_s=then)
        at_kill = latest(root)
        if at_kill != FINAL:
            break
        tried.append(f"{then:.2f} s")
        span = (root / FINAL).stat().st_mtime - (root / "rollout_000001").stat().st_mtime
    else:
        pytest.skip(f"each run finished before its moment after its first checkpoint ({', '.join(tried)}; seed {SEED})")
    finish(start(work, name, [f"save={root}", f"load={root}"]), work, name)
    assert_same_run(root, ref(), f" (killed {then:.2f} s after the first checkpoint, latest {at_kill}, seed {SEED})")


@pytest.mark.integration
def test_a_checkpoint_write_that_hangs_is_a_stall_with_the_stacks_and_the_resume(reference):
    """A stuck filesystem: every fsync inside the save of rollout_000003 never returns. Checkpoint writes have no
    timeout of their own; the stall watchdog ends the run (exit 3) naming the intact rollout_000001, the dump shows
    the save stuck in fsync, nothing of rollout_000003 is published, and the resume ends bit-identical."""
    work, ref = reference
    root = work / "h_ckpt"
    victim = start(work, "h", [f"save={root}", "stall_min_timeout_s=15", "stall_timeout_factor=3", f"output_dir={work}/h_out"],
                   fsync_hang_on=".rollout_000003.tmp-")
    text = finish(victim, work, "h", rc=3, timeout=300)
    assert "stall: no rollout step finished in" in text and "stall_min_timeout_s=15" in text, text[-3000:]
    assert f"{root / 'rollout_000001'}: resume with load=" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    dump = (work / "h_out" / "stall_stacks.txt").read_text()
    assert "_fsync_on_a_stuck_filesystem" in dump and "save_checkpoint" in dump, dump[-3000:]
    assert not (root / "rollout_000003").exists() and latest(root) == "rollout_000001"
    finish(start(work, "h", [f"save={root}", f"load={root}"]), work, "h")
    assert not list(root.glob(".*.tmp-*")), "the stuck save's temporary directory is removed by the next save"
    assert_same_run(root, ref())


@pytest.mark.integration
def test_broken_checkpoint_named_directly_exits_2_naming_the_file(reference, tmp_path):
    """load=<one checkpoint> whose weights are cut short: exit 2, the file and the save root to use instead."""
    work, ref = reference
    root = tmp_path / "copy"
    shutil.copytree(ref(), root)
    weights = root / FINAL / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    proc = run_cli([*ARGS, f"hydra.run.dir={tmp_path}/run", f"load={root / FINAL}", f"save={tmp_path}/s"], tmp_path,
                   timeout=240)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"load={root / FINAL}: the checkpoint is broken:" in proc.stderr
    assert f"{weights}: {weights.stat().st_size} bytes, the manifest records {2 * weights.stat().st_size}" in proc.stderr
    assert f"set load={root} to resume from the newest checkpoint there that loads" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.integration
def test_a_checkpoint_whose_state_runs_a_command_stops_the_run_before_it_runs(reference, tmp_path):
    """A state.pt whose pickle runs `touch` (the manifest rewritten to match), in the newest checkpoint of a save root:
    load=<save root> exits 2 naming the file, without falling back to an older checkpoint, and the command never ran."""
    work, ref = reference
    root, marker = tmp_path / "copy", tmp_path / "ran"
    shutil.copytree(ref(), root)
    bad = crafted_state(root / FINAL, marker)
    proc = run_cli([*ARGS, f"hydra.run.dir={tmp_path}/run", f"load={root}", f"save={tmp_path}/s"], tmp_path,
                   timeout=240)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"error: {bad}: refused: its pickle asks to run code when loaded (" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not marker.exists()


def mount_tmpfs(path: Path, size: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.integration
def test_disk_full_during_a_save_keeps_the_previous_checkpoint(reference, tmp_path):
    """A real full disk: save on a tmpfs holding 1.5 checkpoints. The save of rollout_000003 fails: exit 2, a message
    naming the directory, `save`, `save_interval` and the intact rollout_000001, nothing left of the failed save;
    resuming from that save root elsewhere ends bit-identical to the uninterrupted run."""
    work, ref = reference
    one = sum(f.stat().st_size for f in (ref() / "rollout_000001").iterdir())
    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, one * 3 // 2):
        pytest.skip("mounting a tmpfs is not allowed here (not root); test_disk_full_in_process covers ENOSPC")
    try:
        root = disk / "ckpt"
        proc = start(tmp_path, "full", [f"save={root}"])
        text = finish(proc, tmp_path, "full", rc=2)
        assert f"saving checkpoint {root / 'rollout_000003'} failed: no space left on the device" in text
        assert f"the previous checkpoint {root / 'rollout_000001'} is intact (checked); load={root} resumes from it" in text
        assert f"point `save` at another disk (save={root} now)" in text and "raise save_interval" in text
        assert "Traceback" not in text
        assert sorted(p.name for p in root.iterdir()) == ["latest", "rollout_000001"] and latest(root) == "rollout_000001"
        resumed = tmp_path / "resumed_ckpt"
        finish(start(tmp_path, "resumed", [f"save={resumed}", f"load={root}"]), tmp_path, "resumed")
        assert_same_run(resumed, ref())
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# ------------------------------------------------------------------------------------ in-process, real files


def weights_writer(n_floats: int):
    """A trainer's write_hf in miniature: real safetensors weights and a config.json."""

    def write(path: str) -> None:
        save_file({"w": torch.arange(n_floats, dtype=torch.float32)}, f"{path}/model.safetensors")
        Path(path, "config.json").write_text(json.dumps({"n": n_floats}))

    return write


def saved_root(tmp_path: Path, ids=(1, 3, 5)) -> Path:
    root = tmp_path / "save"
    for i in ids:
        save_checkpoint(str(root), i, weights_writer(16 + i), {"rollout_id": i})
    return root


def test_every_file_is_fsynced_before_the_directory_is_renamed(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))), real_replace(a, b))[1])
    root = saved_root(tmp_path, ids=(4,))
    final, tmp = root / "rollout_000004", f"{root}/.rollout_000004.tmp-{os.getpid()}"
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest == {"rollout_id": 4, "files": {"config.json": 9, "model.safetensors": 8 + 56 + 20 * 4,
                                                   **{f: (final / f).stat().st_size for f in ("state.json", "state.safetensors")}}}
    rename = events.index(("replace", tmp, str(final)))
    synced_before = {e[1] for e in events[:rename] if e[0] == "fsync"}
    assert {f"{tmp}/{f}" for f in (*manifest["files"], "manifest.json")} | {tmp} <= synced_before
    latest_tmp = f"{root}/.latest.tmp-{os.getpid()}"
    assert events[rename + 1:] == [("fsync", str(root)), ("fsync", latest_tmp), ("replace", latest_tmp, f"{root}/latest"),
                                   ("fsync", str(root))]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "rollout_000004"] and latest(root) == "rollout_000004"


def test_save_root_skips_broken_checkpoints_with_a_warning(tmp_path, caplog):
    root = saved_root(tmp_path)
    # safetensors: 8 bytes of length, the 56-byte header {"w":{"dtype":"F32","shape":[21],"data_offsets":[0,84]}},
    # 21 floats of 4 bytes: 8 + 56 + 84 = 148 bytes written
    os.truncate(root / "rollout_000005" / "model.safetensors", 50)
    (root / "rollout_000003" / "manifest.json").unlink()  # as written before manifests: the format checks alone
    for f in ("state.json", "state.safetensors"):  # an older release's state.pt instead, cut short
        (root / "rollout_000003" / f).unlink()
    (root / "rollout_000003" / "state.pt").write_bytes(b"PK\x03\x04 not a zip")
    with caplog.at_level(logging.WARNING):
        assert resolve_checkpoint(str(root)) == root / "rollout_000001"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert warned[0].startswith(f"load={root}: skipped rollout_000005, which does not load: "
                                f"{root}/rollout_000005/model.safetensors: 50 bytes, the manifest records 148 (truncated)")
    assert f"skipped rollout_000003, which does not load: {root}/rollout_000003/state.pt: does not load" in warned[1]
    assert all(w.endswith(f"resuming from {root}/rollout_000001") for w in warned)


def test_checkpoint_named_directly_is_never_swapped(tmp_path):
    root = saved_root(tmp_path)
    os.truncate(root / "rollout_000005" / "model.safetensors", 100)
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(str(root / "rollout_000005"))
    assert e.value.exit_code == 2
    assert str(e.value) == (f"load={root}/rollout_000005: the checkpoint is broken:\n"
                            f"  - {root}/rollout_000005/model.safetensors: 100 bytes, the manifest records 148 (truncated)\n"
                            f"set load={root} to resume from the newest checkpoint there that loads (a checkpoint named "
                            "directly is never swapped for another)")
    legacy = root / "rollout_000003"  # no manifest: the header still tells the length, 8 + 56 + 19 x 4 = 140
    (legacy / "manifest.json").unlink()
    os.truncate(legacy / "model.safetensors", 100)
    with pytest.raises(CheckpointError, match=r"model.safetensors: 100 bytes, its header needs 140 \(truncated\)"):
        resolve_checkpoint(str(legacy))
    with pytest.raises(CheckpointError, match="an unfinished save"):
        resolve_checkpoint(str(root / ".rollout_000007.tmp-12345"))
    hf = tmp_path / "hf"  # a model without the state to resume: not for load
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="neither a checkpoint .* a Hugging Face model to start from goes in "
                                              "model.hf_checkpoint"):
        resolve_checkpoint(str(hf))


def test_latest_names_the_start_newer_ones_are_not_taken(tmp_path, caplog):
    root = saved_root(tmp_path)
    (root / "latest").write_text("rollout_000003\n")  # as after a kill between publishing rollout_000005 and latest
    with caplog.at_level(logging.WARNING):
        assert resolve_checkpoint(str(root)) == root / "rollout_000003"
    assert "not resuming from rollout_000005, newer than `latest` (rollout_000003)" in caplog.text
    shutil.rmtree(root / "rollout_000003")  # latest names a checkpoint that is gone: the next older one
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert resolve_checkpoint(str(root)) == root / "rollout_000001"
    assert f"skipped rollout_000003, which does not load: {root}/rollout_000003: no such directory" in caplog.text
    (root / "latest").unlink()  # no latest at all: the newest that loads
    assert resolve_checkpoint(str(root)) == root / "rollout_000005"


def test_no_checkpoint_loads_lists_each(tmp_path):
    root = saved_root(tmp_path, ids=(1, 3))
    for name in ("rollout_000001", "rollout_000003"):
        (root / name / "config.json").write_text("{")
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint(str(root))
    text = str(e.value)
    assert text.startswith(f"load={root}: no checkpoint in this save root loads:\n  - rollout_000003: {root}/rollout_000003/"
                           "config.json: 1 bytes, the manifest records 9 (truncated)\n  - rollout_000001: ")
    assert text.endswith("start without load (a fresh run), or point load at a checkpoint kept elsewhere")


def test_stale_partial_saves_are_removed_live_ones_kept(tmp_path):
    root = saved_root(tmp_path, ids=(1,))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone, running = root / f".rollout_000003.tmp-{dead.pid}", root / f".rollout_000003.tmp-{os.getppid()}"
    for d in (gone, running):
        d.mkdir()
    save_checkpoint(str(root), 3, weights_writer(4), {"rollout_id": 3})
    assert not gone.exists() and running.exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, or None where mounting is not allowed."""
    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, 1 << 20):
        yield None
        return
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.parametrize("where", ["weights", "state", "injected"])
def test_disk_full_in_process(tmp_path, small_disk, where):
    """The second save does not fit: in the weights (safetensors' error), in the state's tensors (the same), or,
    `injected`, an OSError(ENOSPC) raised by the writer itself after half its bytes (also where mount is refused)."""
    if small_disk is None and where != "injected":
        pytest.skip("mounting a tmpfs is not allowed here (not root)")
    root = (small_disk if where != "injected" else tmp_path) / "ckpt"
    big = 200_000  # floats: 800 kB, one fits in 1 MiB, two do not
    save_checkpoint(str(root), 1, weights_writer(big), {"rollout_id": 1})

    def injected(path: str) -> None:
        with open(f"{path}/model.safetensors", "wb") as f:
            f.write(b"\0" * 1000)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f.name)

    writer, state = {"weights": (weights_writer(big), {}), "state": (weights_writer(4), {"x": torch.zeros(big)}),
                     "injected": (injected, {})}[where]
    with pytest.raises(CheckpointError) as e:
        save_checkpoint(str(root), 3, writer, {"rollout_id": 3, **state})
    assert e.value.exit_code == 2
    text = str(e.value)
    assert text.startswith(f"saving checkpoint {root}/rollout_000003 failed: no space left on the device (")
    assert text.endswith(f"Nothing of this save was left behind; the previous checkpoint {root}/rollout_000001 is intact "
                         f"(checked); load={root} resumes from it. Free space on that disk, point `save` at another disk "
                         f"(save={root} now), or save less often (raise save_interval; the last rollout is always "
                         f"saved), then resume with load={root}")
    assert sorted(p.name for p in root.iterdir()) == ["latest", "rollout_000001"]
    assert resolve_checkpoint(str(root)) == root / "rollout_000001"
    assert torch.equal(load_file(root / "rollout_000001" / "model.safetensors")["w"], torch.arange(big, dtype=torch.float32))


def test_a_failure_that_is_not_the_disk_keeps_its_traceback(tmp_path):
    root = saved_root(tmp_path, ids=(1,))

    def buggy(path: str) -> None:
        raise KeyError("a bug in a trainer's save")

    with pytest.raises(KeyError) as e:
        save_checkpoint(str(root), 3, buggy, {})
    assert e.value.__notes__ == [f"the previous checkpoint {root}/rollout_000001 is intact (checked); load={root} "
                                 "resumes from it"]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "rollout_000001"]
