"""A graceful stop on SIGTERM or SIGINT, within a grace period (`stop_grace_s`).

Cluster schedulers stop a job with SIGTERM, then SIGKILL after a grace period (SLURM's KillWait: 30 s); a user stops
one with Ctrl-C. On the first of these signals the run finishes the rollout step it is in, writes a checkpoint (the
one a periodic save would have written there: a resume from it continues exactly), marks its tracker run KILLED,
stops its children and Ray actors, and exits 128 + the signal (143 for SIGTERM, 130 for SIGINT). If that has not
happened `stop_grace_s` after the signal (a step longer than the grace), or a second signal comes, the step is
abandoned: the tracker run is marked KILLED (a bounded try), every process the run started is killed, and it exits
at once with that code; the last periodic checkpoint stands.

What the signal reaches: the driver handles it; data workers ignore it (data/workers.py), SGLang servers run in
sessions of their own, and the processes of a local Ray cluster the run starts leave it to the driver
(orchestration/placement.py), so a scheduler's signal to the whole process group does not kill them under the step
being finished. Signals are handled in a driver's main thread only: a job of Hydra's Ray launcher runs as a task in a
Ray worker ($RAY_RAYLET_PID set), whose signals are Ray's.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Callable, Optional

SIGNALS = (signal.SIGTERM, signal.SIGINT)
KILLED_TRY_S = 3.0  # how long a hard stop waits for the tracker to take the KILLED status


def processes() -> dict[int, list[str]]:
    """pid -> the fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, ...), every process (Linux)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            out[int(entry)] = stat[stat.rindex(")") + 2:].split()
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (Linux /proc), children before their own."""
    children: dict[int, list[int]] = {}
    for p, fields in processes().items():
        children.setdefault(int(fields[1]), []).append(p)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def kill_descendants() -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class GracefulStop:
    """Installed around a run (a context manager): `requested()` turns true at the first signal; `on_abandon` runs
    (bounded) before a hard stop, which exits the process."""

    def __init__(self, grace_s: float, on_abandon: Callable[[str], None] = lambda why: None):
        self.grace_s, self.on_abandon = grace_s, on_abandon
        self.signum: Optional[int] = None
        self._old: dict[int, object] = {}
        self._timer: Optional[threading.Timer] = None

    def __enter__(self) -> "GracefulStop":
        self.take_signals()
        return self

    def take_signals(self) -> None:
        """Handle SIGTERM and SIGINT here (a driver's main thread only: module docstring). Again after ray.init: a Ray
        driver's core worker installs a SIGTERM handler of its own, which aborts the process."""
        if threading.current_thread() is threading.main_thread() and "RAY_RAYLET_PID" not in os.environ:
            for s in SIGNALS:
                old = signal.signal(s, self._handle)
                self._old.setdefault(s, old)

    def __exit__(self, *exc) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        # the timer stays: whatever follows a stop (exit handlers, Ray's shutdown) is bounded by the grace too

    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGTERM)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum or signal.SIGTERM).name

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            self._hard(signum, f"a second signal ({signal.Signals(signum).name})")
        self.signum = signum
        print(f"\n{self.name}: finishing the current step, then a checkpoint and a clean stop within stop_grace_s="
              f"{self.grace_s:g} s (a second signal stops at once)", file=sys.stderr, flush=True)
        self._timer = threading.Timer(self.grace_s, self._hard, (signum, f"stop_grace_s={self.grace_s:g} s passed"))
        self._timer.daemon = True
        self._timer.start()

    def _hard(self, signum: int, why: str) -> None:
        """Abandon the step: the tracker told (bounded), every process of the run killed, exit now."""
        done = threading.Thread(target=self.on_abandon, args=(why,), daemon=True)
        done.start()
        done.join(KILLED_TRY_S)
        kill_descendants()
        sys.stderr.flush()
        os._exit(128 + signum)
