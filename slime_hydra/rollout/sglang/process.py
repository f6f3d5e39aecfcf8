"""Child processes the rollout side owns: free ports, log files, and no orphans.

Each child starts in its own session (so the whole tree an SGLang server spawns, scheduler and
detokenizer included, is one process group) with PR_SET_PDEATHSIG, so it gets SIGTERM if the runner
dies without cleaning up. `stop()` sends SIGTERM to the group, then SIGKILL after a grace period;
every process is also stopped at interpreter exit.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import time
import weakref
from pathlib import Path

from slime_hydra import ports
from slime_hydra.config.redact import redact_argv

_LIVE: "weakref.WeakSet[ManagedProcess]" = weakref.WeakSet()


def free_port(avoid: set[int] | None = None) -> int:
    return ports.free_port(frozenset(avoid or ()))


def _die_with_parent() -> None:
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ManagedProcess:
    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict | None = None):
        self.name, self.argv, self.log_path = name, argv, Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ManagedProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"\n=== {time.strftime('%H:%M:%S')} start: {' '.join(redact_argv(self.argv))}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env, preexec_fn=_die_with_parent)
        log.close()
        _LIVE.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                # the leader is gone; children of the group may linger a moment
                deadline = time.monotonic() + wait
                while _group_alive(self.proc.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not _group_alive(self.proc.pid):
                    break
            except subprocess.TimeoutExpired:
                continue
        _LIVE.discard(self)

    def listens_on(self, port: int) -> bool:
        """Whether the socket listening on `port` belongs to this process's group (the server that was started, not
        another process that took its port)."""
        return self.proc is not None and group_holds(self.proc.pid, listening_sockets(port))

    def kill(self) -> None:
        """SIGKILL the whole group at once (what a crash looks like)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:  # SIGKILL cannot be ignored, but a process in uninterruptible I/O (a stuck driver) exits only later
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def listening_sockets(port: int) -> set[str]:
    """The sockets listening on TCP `port` on any address, as /proc/<pid>/fd links name them ("socket:[inode]")."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()  # sl local_address rem_address st ... inode
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                found.add(f"socket:[{cols[9]}]")
    return found


def group_holds(pgid: int, sockets: set[str]) -> bool:
    """Whether a process of group `pgid` (a child started in its own session: pgid = its pid) has one of `sockets`."""
    if not sockets:
        return False
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getpgid(int(d.name)) != pgid:
                continue
            if any(os.readlink(fd) in sockets for fd in (d / "fd").iterdir()):
                return True
        except OSError:  # gone meanwhile
            continue
    return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@atexit.register
def _stop_all() -> None:
    for p in list(_LIVE):
        p.stop(grace_s=5.0)
