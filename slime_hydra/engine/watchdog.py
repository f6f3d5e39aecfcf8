"""The stall watchdog: a run whose rollout steps stop finishing fails with every thread's stack, not silence.

A daemon thread watches a step counter (the length of the run's history, which the loop appends once per
rollout step). After the first step it knows what a step costs; when the next one takes longer than
max(min_timeout_s, factor x the longest of the last 5 steps), it writes every thread's stack to a file in the
run directory, prints where it is, and interrupts the main thread with StallError (exit 3). A main thread that
does not unwind within `grace_s` (stuck in C code) is ended with os._exit(3) after the message is out.
Before the first step nothing is armed: engine start, warm start and the first eval have timeouts of their own.
Under Ray, `more_stacks` (orchestration/stacks.collect over the run's actors) appends every actor's stacks to the
same file: the train ranks' and the rollout manager's, taken by a signal, so a rank stuck in C code answers too.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

from slime_hydra.errors import StallError

WINDOW = 5  # recent steps whose longest sets the deadline


def dump_stacks(path: Path, more: Callable[[], str] | None = None) -> Path:
    """Every Python thread's stack, innermost call last, to `path`; then `more()` (other processes' stacks)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = [f"stall dump at {time.strftime('%Y-%m-%d %H:%M:%S')}, pid {os.getpid()}\n"]
    for ident, frame in sys._current_frames().items():
        lines.append(f"\n--- thread {names.get(ident, '?')} ({ident}) ---\n")
        lines.extend(traceback.format_stack(frame))
    if more is not None:
        try:
            lines.append(f"\n=== other processes ===\n{more()}")
        except Exception as e:  # the driver's own stacks must reach the file whatever the actors do
            lines.append(f"\n=== other processes: not collected: {type(e).__name__}: {e} ===\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    return path


class StallWatchdog:
    """`with StallWatchdog(steps, ...)`: `steps()` returns how many rollout steps have finished so far."""

    def __init__(self, steps: Callable[[], int], factor: float, min_timeout_s: float, dump_path: Path,
                 resume_hint: Callable[[], str], poll_s: float = 1.0, grace_s: float = 60.0,
                 more_stacks: Callable[[], str] | None = None):
        self.steps, self.factor, self.min_timeout_s = steps, factor, min_timeout_s
        self.dump_path, self.resume_hint, self.poll_s, self.grace_s = dump_path, resume_hint, poll_s, grace_s
        self.more_stacks = more_stacks
        self.fired: Optional[str] = None  # the message, once it fired
        self._stop = threading.Event()
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
        self._old_handler = None

    def deadline_s(self, recent: list[float]) -> float:
        return max([self.min_timeout_s] + [self.factor * t for t in recent[-WINDOW:]])

    def __enter__(self) -> "StallWatchdog":
        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            self._old_handler = signal.signal(signal.SIGUSR1, self._raise)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._old_handler is not None:
            signal.signal(signal.SIGUSR1, self._old_handler)

    def _raise(self, signum, frame) -> None:
        if self.fired:
            raise StallError(self.fired)

    def _watch(self) -> None:
        seen, last_t = self.steps(), time.monotonic()
        armed, recent = False, []  # armed at the first step that finishes here; recent: step times after it
        while not self._stop.wait(self.poll_s):
            now, n = time.monotonic(), self.steps()
            if n != seen:
                if armed:  # the interval up to the first step includes start-up: not a step time
                    recent.append((now - last_t) / max(n - seen, 1))
                armed, seen, last_t = True, n, now
                continue
            if not armed or now - last_t <= self.deadline_s(recent):
                continue
            self._fire(now - last_t, recent)
            return

    def _fire(self, waited: float, recent: list[float]) -> None:
        path = dump_stacks(self.dump_path.resolve(), self.more_stacks)
        longest = f"{max(recent[-WINDOW:]):.1f} s" if recent else "none yet"
        self.fired = (f"stall: no rollout step finished in {waited:.0f} s (deadline {self.deadline_s(recent):.0f} s: "
                      f"the larger of stall_min_timeout_s={self.min_timeout_s:g} and stall_timeout_factor={self.factor:g} "
                      f"x the longest recent step, {longest}); every thread's stack is in {path}. Raise "
                      f"stall_min_timeout_s or stall_timeout_factor if the step is only slow, or set "
                      f"stall_watchdog=false. {self.resume_hint()}")
        signal.pthread_kill(self._main, signal.SIGUSR1)  # the CLI prints the StallError it raises
        if not self._stop.wait(self.grace_s):  # the main thread did not unwind (stuck in C code)
            print(f"error: {self.fired}\nerror: the main thread did not stop within {self.grace_s:g} s of the "
                  "stall; exiting", file=sys.stderr, flush=True)
            os._exit(StallError.exit_code)
