"""`python -m slime_hydra ARGS` forked from a warm interpreter instead of a cold one.

A CLI run's process spends about 5 CPU-seconds importing torch, transformers, Hydra and MLflow before it reads its first
override; the tier runs dozens. Here one process per test worker imports them once (multiprocessing's forkserver,
with IMPORTS preloaded), and each run is a fork of it that runs the package's `__main__` as `python -m` does: sys.argv,
sys.path, the working directory and the environment are the run's own, multiprocessing sees a main process; stdout and
stderr are files (so the run's children write to them too); it ends as that interpreter ends: SystemExit's code, 1 with
the traceback for an uncaught error, death by SIGINT for an uncaught KeyboardInterrupt, threads joined and atexit
handlers run first. `Process` gives Popen's surface (pid, poll, wait, communicate, send_signal, kill, returncode), in a
session of its own when asked (start_new_session), for the tests that signal a run's process group.

What a fork cannot reproduce is an environment read at import time. A run forks only when its environment is the one
the forkserver imported under (SESSION_ENV: the session's, with the CLI's own additions); a test that sets anything else
gets a cold `python -m` (runs.run_cli and runs.start_cli fall back), as every run does with SLIME_HYDRA_TEST_COLD_CLI=1. So do runs that must start cold: the fault hooks'
sitecustomize (tests/engine/test_checkpoint.py), `ray job submit`. The megatron CPU shim's entry point
(tests/support/megatron_cpu/cli.py) forks too: the forkserver imports neither megatron-core nor what the shim blocks, so
the shim installs in the fork as it does in a fresh interpreter. A forked run's sys.executable is RAY_PYTHON where
conftest sets it: a local Ray cluster the run starts forks its workers too (tests/support/ray_worker_zygote.py).
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# preloaded by the forkserver: that module imports what a run of the embedded default imports (`python -X importtime`)
IMPORTS = ["tests.support.warm_cli_imports"]

# the environment the forkserver imports under: a CLI child's environment as the session began (conftest sets it)
SESSION_ENV: dict[str, str] = {}
# set per test and read by nothing at import time: pytest's test phase; where a run's own local Ray cluster keeps its
# files (Ray reads it when the cluster starts)
PER_TEST = ("PYTEST_CURRENT_TEST", "RAY_TMPDIR")
_MAIN_PROCESS = type(multiprocessing.current_process())  # multiprocessing's _MainProcess (imported before any fork)
_started: list[list[str]] = []  # [sys.path of a fresh interpreter under SESSION_ENV] once the forkserver runs
# [the launcher a run's own local Ray cluster starts workers with]: tests/support/ray_worker_zygote.py, set by conftest
RAY_PYTHON: list[str] = []


def _exec_module(module: str, argv: list[str], cwd: str, env: dict[str, str], search_path: list[str], out: str, err: str,
                 new_session: bool, ray_python: str | None) -> None:
    """The forked child: become `python -m module argv` in `cwd` with `env`, stdout/stderr to the files, and end as that
    interpreter ends (exit code, traceback, atexit handlers, SIGINT's death)."""
    from multiprocessing import process

    if new_session:
        os.setsid()  # as Popen(start_new_session=True): its own session and process group
    for fd, name in ((1, out), (2, err)):
        f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115  (line-buffered text on the run's fd, as -u)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    # multiprocessing sees a main process, as in a fresh interpreter (its children are the run's own)
    process._current_process, process._parent_process, process._children = _MAIN_PROCESS(), None, set()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = [cwd, *search_path]  # as `python -m` starts: the working directory, PYTHONPATH, stdlib, site-packages
    sys.argv = [module, *argv]
    if ray_python:  # the Python a local Ray cluster of the run starts its workers with (its raylet reads sys.executable)
        sys.executable = ray_python
    code: int | str = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = "SIGINT"
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # what a normal interpreter exit runs, in its order: wait for threads, then atexit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == "SIGINT":  # CPython ends an uncaught KeyboardInterrupt by dying of SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def usable(env: dict[str, str]) -> bool:
    """Whether a run with `env` may fork from the forkserver: the environment is the one it imported under."""
    strip = lambda e: {k: v for k, v in e.items() if k not in PER_TEST}  # noqa: E731
    return (bool(SESSION_ENV) and strip(env) == strip(SESSION_ENV) and sys.platform == "linux"
            and not os.environ.get("SLIME_HYDRA_TEST_COLD_CLI"))


def start() -> list[str]:
    """This process's forkserver with IMPORTS preloaded, started under SESSION_ENV; returns a fresh interpreter's sys.path
    (after its first entry) under that environment."""
    from multiprocessing import forkserver

    if not _started:
        fresh = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"], env=SESSION_ENV,
                               capture_output=True, text=True, check=True, timeout=60)
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(SESSION_ENV)
        try:
            forkserver.set_forkserver_preload(IMPORTS)
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _started.append(json.loads(fresh.stdout))
    return _started[0]


class Process:
    """A forked CLI run with subprocess.Popen's surface for what the tests use: pid, poll, wait, communicate (text),
    send_signal, kill, returncode (negative: the signal that ended it)."""

    def __init__(self, module: str, argv: list[str], cwd: Path, env: dict[str, str], new_session: bool = False,
                 log: Path | None = None):
        self.args = [sys.executable, "-m", module, *argv]
        self._tmp = tempfile.TemporaryDirectory(prefix="warm_cli_")
        self._out, self._err = os.path.join(self._tmp.name, "stdout"), os.path.join(self._tmp.name, "stderr")
        if log is not None:  # both streams appended to one file, as Popen(stdout=file, stderr=STDOUT)
            self._out = self._err = str(log)
        search_path = start()
        ctx = multiprocessing.get_context("forkserver")
        self._proc = ctx.Process(target=_exec_module, name=f"python -m {module}",
                                 args=(module, argv, str(cwd), env, search_path, self._out, self._err, new_session,
                                       RAY_PYTHON[0] if RAY_PYTHON else None))
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._proc.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired as e:
            e.output, e.stderr = self._read()
            raise
        return self._read()

    def kill(self) -> None:
        self._proc.kill()

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:  # as Popen: nothing once it has ended
            os.kill(self.pid, sig)

    def _read(self) -> tuple[str, str]:
        read = lambda f: Path(f).read_text(errors="replace") if os.path.exists(f) else ""  # noqa: E731
        return (read(self._out), "" if self._err == self._out else read(self._err))

    def __del__(self):
        if self._proc.exitcode is not None:
            self._tmp.cleanup()


def run(module: str, argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """As subprocess.run([python, -m, module, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)."""
    proc = Process(module, argv, cwd, env)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # as subprocess.run: kill it, wait for it, raise
        proc.wait(30)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
