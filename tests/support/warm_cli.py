"""`python -m slime_hydra ARGS` forked from a warm interpreter instead of a cold one.

A CLI run's process spends about 5 CPU-seconds importing torch, transformers, Hydra and MLflow before it reads its first
override; the tier runs dozens. Here one process per test worker imports them once (multiprocessing's forkserver,
with IMPORTS preloaded), and each run is a fork of it that runs the package's `__main__` exactly as `python -m` does:
sys.argv, the working directory and the environment are the run's own; stdout and stderr are files (so the run's
children write to them too); the exit code is SystemExit's, 1 with the traceback for an uncaught error; atexit handlers
run at the end, as at a normal interpreter exit.

What a fork cannot reproduce is an environment read at import time. A run forks only when its environment is the one
the forkserver imported under (SESSION_ENV: the session's, with the CLI's own additions); a test that sets anything else
gets a cold `python -m` (runs.run_cli falls back). Tests that signal the run or look at its process group start their own
process and never come here.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

# what a run of the embedded default imports, in the order it does (measured: `python -X importtime -m slime_hydra`)
IMPORTS = ["tests.support.warm_cli_imports"]

# the environment the forkserver imports under: a CLI child's environment as the session began (conftest sets it)
SESSION_ENV: dict[str, str] = {}
# set by pytest for each test phase, read by nothing at import time
PER_TEST = ("PYTEST_CURRENT_TEST",)
_started: list[list[str]] = []  # [sys.path of a fresh interpreter under SESSION_ENV] once the forkserver runs


def _exec_module(module: str, argv: list[str], cwd: str, env: dict[str, str], path: list[str], out: str, err: str) -> None:
    """The forked child: become `python -m module argv` in `cwd` with `env`, stdout/stderr to the files."""
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115  (line-buffered text on the run's fd, as -u)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = [cwd, *path]  # as `python -m` starts: the working directory, then PYTHONPATH, the stdlib, site-packages
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:  # a forked child ends in os._exit: run what a normal interpreter exit runs
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


def usable(env: dict[str, str]) -> bool:
    """Whether a run with `env` may fork from the forkserver: the environment is the one it imported under."""
    strip = lambda e: {k: v for k, v in e.items() if k not in PER_TEST}  # noqa: E731
    return bool(SESSION_ENV) and strip(env) == strip(SESSION_ENV) and sys.platform == "linux"


def _start() -> list[str]:
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


def run(module: str, argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """As subprocess.run([python, -m, module, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)."""
    path = _start()
    ctx = multiprocessing.get_context("forkserver")
    with tempfile.TemporaryDirectory(prefix="warm_cli_") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        proc = ctx.Process(target=_exec_module, args=(module, argv, str(cwd), env, path, out, err), name=f"python -m {module}")
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join(30)
            raise subprocess.TimeoutExpired([sys.executable, "-m", module, *argv], timeout,
                                            Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace"))
        return subprocess.CompletedProcess([sys.executable, "-m", module, *argv], proc.exitcode,
                                           Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace"))
