"""Every Ray actor's Python stacks, for the stall watchdog (engine/watchdog.py dumps the driver's own threads).

An actor calls `register(label, directory)` when it starts: faulthandler writes every thread's stack to
`<directory>/stacks_<label>.txt` when the process gets SIGUSR2 (Ray claims SIGUSR1 for Tune; SIGUSR2 is free in
workers). faulthandler writes from the signal handler in C, so the dump comes even when the actor's main thread is
stuck in C code (a hung collective, a blocking read) and could not answer a Ray call. The driver keeps each actor's
`ActorProcess` and, when a step stalls, `collect` signals every actor on its own node and reads the files back
with a deadline; an actor on another node is named with the path of its dump there (signals do not cross hosts).
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

SIGNAL = signal.SIGUSR2
_files: list = []  # the open dump files, kept alive for faulthandler (it holds only the descriptor)


@dataclass(frozen=True)
class ActorProcess:
    label: str  # "train rank 1", "rollout manager"
    host: str
    pid: int
    path: str  # the dump file on `host`


def register(label: str, directory: str) -> ActorProcess:
    """In the actor's process: dump every thread's stack to this actor's file on SIGUSR2."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / f"stacks_{re.sub(r'[^A-Za-z0-9_.-]', '_', label)}.txt"
    f = open(path, "w")  # noqa: SIM115 - must stay open for the process's lifetime
    _files.append(f)
    faulthandler.register(SIGNAL, file=f, all_threads=True, chain=False)
    return ActorProcess(label, socket.gethostname(), os.getpid(), str(path))


def collect(actors: list[ActorProcess], deadline_s: float = 10.0) -> str:
    """Signal each actor on this host, wait (up to `deadline_s` in all) for its file to fill, return the text."""
    here, sent, parts = socket.gethostname(), [], []
    for a in actors:
        if a.host != here:
            parts.append(f"--- {a.label} (pid {a.pid} on {a.host}): not signalled from {here}; "
                         f"send SIGUSR2 to it there and read {a.path} ---\n")
            continue
        try:
            Path(a.path).write_text("")  # a previous dump's text must not pass for this one
            os.kill(a.pid, SIGNAL)
            sent.append(a)
        except OSError as e:  # the process is gone: Ray reports its death where the call waits
            parts.append(f"--- {a.label} (pid {a.pid}): not signalled: {e} ---\n")
    end = time.monotonic() + deadline_s
    for a in sent:
        text = ""
        while time.monotonic() < end and not (text := Path(a.path).read_text()).strip():
            time.sleep(0.05)
        time.sleep(0.1)  # faulthandler writes thread by thread: let the last lines land
        text = Path(a.path).read_text()
        body = text if text.strip() else f"(no dump within {deadline_s:g} s)\n"
        parts.append(f"--- {a.label} (pid {a.pid} on {a.host}, {a.path}) ---\n{body}")
    return "".join(parts)
