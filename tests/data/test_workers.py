"""Data workers die with the driver (data/workers.py): SIGKILL the driver of a streaming run with 2 workers, blocked
on their full queues, and no worker is alive 5 s later; once through the death signal (the reader opened on the main
thread: a whole CLI run) and once through the parent check of each put (opened on another thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime_hydra.config.store import asset_path
from tests.support.runs import FAST, cli_env

pytestmark = pytest.mark.integration  # spawns drivers and their workers

DEADLINE_S = 5.0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")  # a zombie has exited; only its parent's wait is missing


def data_workers(driver: int) -> list[int]:
    """The driver's spawned children that run multiprocessing's spawn_main (not its resource tracker)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) and st[1] == driver:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"spawn_main" in cmd:
                out.append(int(entry))
    return out


def working(pid: int) -> bool:
    """The worker runs its loop: it ignores SIGTERM, which data/workers.py sets as it starts (after its imports)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(ignored >> (signal.SIGTERM - 1) & 1)


def kill_driver_and_watch(proc: subprocess.Popen, workers: int = 2, settle_s: float = 2.0) -> list[int]:
    """Waits for the driver's `workers` data workers to run their loops, lets their queues fill, SIGKILLs the driver;
    the workers still alive DEADLINE_S later."""
    deadline = time.monotonic() + 300  # a busy machine: the driver and its workers import torch and the tokenizer
    found: list[int] = []
    while len(found) < workers or not all(working(p) for p in found):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"the driver's data workers never started: {found}"
        time.sleep(0.2)
        found = data_workers(proc.pid)
    time.sleep(settle_s)  # their queues fill: blocked on a full queue
    assert proc.poll() is None and all(alive(p) for p in found), "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end and any(alive(p) for p in found):
        time.sleep(0.1)
    for p in found:  # whatever is left is the test's to clean up
        if alive(p):
            os.kill(p, signal.SIGKILL)
    return [p for p in found if _stat(p) is not None and _stat(p)[0] not in ("Z", "X")]


def test_workers_of_a_sigkilled_cli_run_die_with_it(tmp_path):
    args = [*FAST, "logger=none", "eval=none", "num_rollout=100000", "data.streaming=true", "data.num_workers=2",
            "data.shuffle_buffer_size=64", f"hydra.run.dir={tmp_path}/run"]
    proc = subprocess.Popen([sys.executable, "-m", "slime_hydra", *args], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert kill_driver_and_watch(proc) == []
    finally:
        proc.kill()


DRIVER = """
import threading, time
from slime_hydra.config.datafiles import resolve
from slime_hydra.data.readers import Prep
from slime_hydra.data.rows import RowKeys
from slime_hydra.data.workers import WorkerReader
from slime_hydra.models.tokenizer import build_char_tokenizer

files, _ = resolve({path!r})
box = []
t = threading.Thread(target=lambda: box.append(WorkerReader(files, Prep(RowKeys("prompt", "label"), build_char_tokenizer()),
                                                            (0, 0, 0), num_workers=2, timeout_s=600, block_rows=64)))
t.start()
t.join()  # the thread that started the workers has exited: their death signal would already have fired
time.sleep(3600)
"""


def test_workers_started_off_the_main_thread_notice_the_driver_is_gone(tmp_path):
    code = DRIVER.format(path=str(asset_path("addition/train.jsonl")))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert kill_driver_and_watch(proc) == []
    finally:
        proc.kill()
