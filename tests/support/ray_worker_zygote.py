"""Ray worker processes of the tier's clusters forked from a warm interpreter instead of started cold.

A Ray worker is a fresh `python default_worker.py ...` (through setup_worker.py first when its job has a runtime env);
before it runs an actor's first method it has imported Ray, and for the tier's rank, rollout and sweep actors torch,
transformers and slime_hydra (megatron-core too under the CPU shim): 1 to 8 CPU-seconds a worker, and the tier starts
about a hundred. A raylet starts its workers with the Python of the process that started it (sys.executable); the
session's head (tests/support/servers.py), the local clusters of forked CLI runs (tests/support/warm_cli.py) and the
multi-node module's cluster get `launcher_script` as theirs. That script runs this file with stdlib only (`launch`):
it hands the worker's argv, environment, working directory and standard streams to a zygote (`serve`: one per
environment and kind of worker), which has imported PRELOAD once (and run the setup hook of HOOK_PRELOAD's jobs, with
what their workers import next) with the sys.path a fresh worker of that kind has, and forks. The fork becomes the
worker setup_worker.py and `python default_worker.py` would have started, in a process group of its own, and registers
with the raylet under its own pid (the raylet signals and watches that pid). The launcher stays as the process the
raylet started: it passes on the signals it gets, ends with the worker's exit status, and if it is killed the worker
dies too. A launch that finds no zygote serving starts one in the background and its own worker cold: no launch waits
for a zygote's imports.

A worker forks only where a fresh one would have imported under the same environment: the zygote's own but for the
keys that differ per worker (PER_WORKER; the fork gets the worker's own values), and a runtime env that sets nothing
but PYTHONPATH and the setup hook (applied after the fork, as setup_worker.py applies them before its exec; the zygote
of that PYTHONPATH imported with the sys.path a fresh worker starts with). Anything else (a runtime env with other
variables, a py_executable or a command prefix, a non-Python worker, SLIME_HYDRA_TEST_COLD_RAY_WORKERS=1) starts cold,
as it would without this file, and so does every other process a raylet starts with its Python (dashboard, agents,
monitors). Each worker's launch appends `forked` or `cold <why>` to its zygote's log, which the tier's summary counts.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys

# imported once by the zygote (what the tier's actors import; nothing here starts a thread, a process or a torch op)
PRELOAD = ["ray", "ray.actor", "ray._private.worker", "ray._private.runtime_env.context", "ray.util.placement_group",
           "tests.support.warm_cli_imports"]
# what differs between workers a fork serves alike (none is read at import; a fork gets the worker's own values): set
# by the raylet for each worker; PWD, the directory the cluster's driver ran in; pytest's test name and xdist worker
PER_WORKER = ("RAY_JOB_ID", "RAY_RAYLET_PID", "_", "PWD", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER")
HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"  # a job's worker_process_setup_hook, as Ray passes it on
# runtime-env variables a fork applies as a fresh worker would see them: PYTHONPATH (each zygote imports with one) and
# the job's setup hook (default_worker.py reads it when it runs, after the fork)
FORKABLE_ENV_VARS = ("PYTHONPATH", HOOK_ENV)
# setup hooks a zygote of their own runs once before it forks (idempotent ones), with what their jobs' workers import
# next: the megatron CPU shim, then megatron-core and the model code every megatron rank imports (about 5.5 CPU-s)
HOOK_PRELOAD = {"tests.support.megatron_cpu.shim.install": ["slime_hydra.training.megatron.model"]}
COLD_FLAG = "SLIME_HYDRA_TEST_COLD_RAY_WORKERS"
NIL_JOB_ID = "ffffffff"  # ray.JobID.nil().hex()
WATCH_THREAD = "zygote-watches-launcher-"  # + the launcher's pid: the forked worker's thread that dies with it
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launcher_script(directory: str, owner: int | None = None) -> str:
    """Write the executable a raylet starts workers with (a shell script: the raylet takes one path) and return it.
    Its zygotes live in `directory`, one per environment, and end once their socket is gone, or once `owner` (a pid)
    has died; with no owner, once the raylet of the worker that started it has died (a cluster of its own)."""
    path = os.path.join(directory, "python")
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"#!/bin/sh\nexec '{sys.executable}' -I -S '{os.path.abspath(__file__)}' launch '{sys.executable}' "
                f"'{directory}' {owner or 0} \"$@\"\n")
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)  # xdist workers may write the session's at once
    return path


def launch_counts(directory: str) -> tuple[int, int]:
    """(forked, started cold) worker launches through the launcher in `directory`."""
    lines: list[str] = []
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        if name.endswith(".sock.log"):
            with open(os.path.join(directory, name)) as f:
                lines += f.read().splitlines()
    return sum(line == "forked" for line in lines), sum(line.startswith("cold") for line in lines)


def stop_zygotes(directory: str) -> None:
    """End the zygotes of `directory` (each ends within a second of its socket's removal)."""
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        if name.endswith(".sock"):
            os.unlink(os.path.join(directory, name))


def _imported_under(env: dict[str, str]) -> dict[str, str]:
    """The part of a worker's environment its imports see alike: all but PER_WORKER."""
    return {k: v for k, v in env.items() if k not in PER_WORKER}


def _socket_for(directory: str, env: dict[str, str], kind: dict[str, str]) -> str:
    """The zygote's socket for workers of this environment and kind (one zygote for each)."""
    import zlib

    key = json.dumps([kind, sorted(_imported_under(env).items())], sort_keys=True).encode()
    return os.path.join(directory, f"z{zlib.crc32(key):08x}.sock")


def _kind(args: list[str], env: dict[str, str]) -> dict[str, str]:
    """What a fresh worker of this launch imports with: its script's directory (the head of its sys.path), its
    PYTHONPATH (the runtime env's, where its job sets one) and its job's setup hook where HOOK_PRELOAD has it."""
    worker = args[1] if os.path.basename(args[0]) == "setup_worker.py" else args[0]
    kind = {"dir": os.path.dirname(worker), "pythonpath": env.get("PYTHONPATH", ""), "hook": ""}
    for a in args:
        if a.startswith("--serialized-runtime-env-context="):
            env_vars = json.loads(a.split("=", 1)[1] or "{}").get("env_vars", {})
            kind["pythonpath"] = env_vars.get("PYTHONPATH", kind["pythonpath"])
            kind["hook"] = env_vars.get(HOOK_ENV, "") if env_vars.get(HOOK_ENV, "") in HOOK_PRELOAD else ""
    return kind


# -- wire: a length-prefixed JSON message each way ---------------------------------------------------------------------

def _send(conn: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    msg = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(conn, [msg], fds)
    else:
        conn.sendall(msg)


def _recv(conn: socket.socket, want_fds: int = 0) -> tuple[dict | None, list[int]]:
    fds: list[int] = []
    buf = b""
    if want_fds:
        buf, fds, _, _ = socket.recv_fds(conn, 1 << 16, want_fds)
    while len(buf) < 4 or len(buf) < 4 + struct.unpack("!I", buf[:4])[0]:
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None, fds
        buf += chunk
    return json.loads(buf[4:4 + struct.unpack("!I", buf[:4])[0]]), fds


# -- launch: the process the raylet starts ---------------------------------------------------------------------------

def _log(sock: str, line: str) -> None:
    fd = os.open(sock + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, (line + "\n").encode())
    os.close(fd)


def _connect(sock: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock)
        return conn
    except OSError:
        conn.close()
        return None


def _start_zygote(python: str, sock: str, owner: int, kind: dict[str, str]) -> None:
    """Start the zygote of `sock` in the background, unless one is starting or serving already: a zygote holds
    `sock.lock` for as long as it lives. The launch that calls this does not wait for it. A raylet gives a worker
    60 s to register, and a zygote's imports (megatron-core's too, for the shim's jobs) can take longer on a loaded
    two-core machine: a launcher that waited and was killed for it freed the lock, and the next launch started a
    second zygote beside the first."""
    import fcntl

    lock = os.open(sock + ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return
    pid = os.fork()
    if pid == 0:  # detached from the launcher: its own session, its output to a file
        os.setsid()
        if os.fork():
            os._exit(0)
        out = os.open(sock + ".zygote.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.set_inheritable(lock, True)  # the zygote holds the lock from here on
        # argv room for the titles Ray's workers set (setproctitle writes within it)
        os.execv(python, [python, "-P", os.path.abspath(__file__), "serve", sock, str(owner), json.dumps(kind),
                          str(lock), " " * 200])
    os.close(lock)
    os.waitpid(pid, 0)


def _is_worker(args: list[str]) -> bool:
    """`default_worker.py ...`, or `setup_worker.py default_worker.py ...` (Ray's client server goes through
    setup_worker.py too, with `-m`)."""
    names = [os.path.basename(a) for a in args[:2]]
    return names[:1] == ["default_worker.py"] or names == ["setup_worker.py", "default_worker.py"]


def launch(python: str, directory: str, owner: int, args: list[str]) -> None:
    def cold(why: str) -> None:
        _log(sock, f"cold {why}")
        os.execv(python, [python, *args])

    if not _is_worker(args):
        os.execv(python, [python, *args])  # the head's own servers: not a worker, nothing logged
    kind = _kind(args, dict(os.environ))
    sock = _socket_for(directory, dict(os.environ), kind)
    if os.environ.get(COLD_FLAG):
        cold(COLD_FLAG)
    conn = _connect(sock)
    if conn is None:
        if os.path.exists(sock + ".failed"):
            cold(f"the zygote failed to start ({sock}.zygote.log)")
        _start_zygote(python, sock, owner, kind)
        cold("the zygote is starting")
    _send(conn, {"argv": args, "env": dict(os.environ), "cwd": os.getcwd()}, [0, 1, 2])
    reply, _ = _recv(conn)
    if reply is None or "cold" in reply:
        conn.close()
        cold(reply["cold"] if reply else "zygote closed")
    _log(sock, "forked")
    pid = reply["pid"]

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    status, _ = _recv(conn)
    if status is None:
        sys.exit(1)
    if status.get("signal"):  # end as the worker ended: by its signal (SIGKILL and SIGSTOP take no handler)
        if status["signal"] not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    sys.exit(status.get("exit", 1))


# -- serve: the zygote -----------------------------------------------------------------------------------------------

def _setup_options(argv: list[str]):
    """A setup_worker.py launch's --language and its runtime env's context (RuntimeEnvContext), as setup_worker.py
    parses them."""
    from ray._private.runtime_env.context import RuntimeEnvContext

    opts = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    return opts.get("--language", "PYTHON"), RuntimeEnvContext.deserialize(opts.get("--serialized-runtime-env-context") or "{}")


def _why_cold(req: dict, env0: dict[str, str], kind: dict[str, str]) -> str | None:
    """None if this worker may fork from a zygote that imported under env0, else why not."""
    env = _imported_under(req["env"])
    if env != env0:
        keys = sorted(k for k in env.keys() | env0.keys() if env.get(k) != env0.get(k))
        return f"environment differs: {keys}"
    argv = req["argv"]
    theirs = _kind(argv, req["env"])
    if "${" in theirs["pythonpath"]:
        return "the runtime env's PYTHONPATH names another variable"
    if theirs != kind:
        return f"a worker of kind {theirs}, this zygote's is {kind}"
    if os.path.basename(argv[0]) == "setup_worker.py":
        language, ctx = _setup_options(argv)
        if language != "PYTHON":
            return "not a Python worker"
        if ctx.command_prefix or ctx.override_worker_entrypoint or ctx.py_executable != sys.executable:
            return "runtime env changes the interpreter"
        extra = sorted(set(ctx.env_vars) - set(FORKABLE_ENV_VARS))
        if extra:
            return f"runtime env sets {extra}"
    return None


def _become_worker(conn: socket.socket, launcher: int, req: dict, fds: list[int]) -> None:
    """The forked child: become the worker setup_worker.py and `python default_worker.py` would have started."""
    import runpy
    import threading
    from multiprocessing import process

    from ray._private.utils import update_envs

    os.setpgid(0, 0)  # a process group of its own, as the raylet starts a worker (it signals the group)
    for fd, target in zip(fds, (0, 1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    argv = list(req["argv"])
    if os.path.basename(argv[0]) == "setup_worker.py":  # as setup_worker.py: apply the runtime env, then the worker
        update_envs(_setup_options(argv)[1].env_vars)
        argv = [a for a in argv[1:] if not a.startswith(("--serialized-runtime-env-context=", "--language="))]
    # sys.path is the zygote's: a fresh worker's of this kind after the same imports (serve)
    sys.argv = argv
    process._current_process, process._parent_process, process._children = (
        type(process._current_process)(), None, set())

    def die_with_launcher():  # the launcher ends: killed by the raylet before the worker registered, or by a test
        try:
            while conn.recv(1024):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    # named for the launcher it watches (tests/test_ray_worker_zygote.py finds it there)
    threading.Thread(target=die_with_launcher, name=f"{WATCH_THREAD}{launcher}", daemon=True).start()
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    import atexit

    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _needed(sock: str, owner: int) -> bool:
    """False once the socket is gone or the owner (a pid) has died."""
    if not os.path.exists(sock):
        return False
    if not owner:
        return True
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        os.unlink(sock)
        return False
    return True


def serve(sock: str, owner: int, kind: dict[str, str], lock: int) -> None:
    """Import once, then fork a worker for each launch that asks, while the owner lives and the socket exists. `lock` is
    the open `sock.lock`, held while this lives; an import that fails leaves `sock.failed`, and launches start cold."""
    env0 = _imported_under(dict(os.environ))
    owner = owner or int(os.environ.get("RAY_RAYLET_PID") or 0)  # no owner: the raylet of the first worker's cluster
    # Ray's C++ config (RayConfig) reads RAY_JOB_ID once, when _raylet.so loads, and no call reads it again. A zygote
    # that imported Ray under the job of the launch that started it had every fork register as that job, and the raylet
    # ended them at once when that job had finished; with none, a worker stops at a failed check. The nil job, as in
    # the workers a raylet starts before any job asks (the session's head's first): a fork then takes its job's work.
    os.environ["RAY_JOB_ID"] = NIL_JOB_ID
    # sys.path as a fresh worker of this kind starts with it, so that the imports below leave it as they leave a fresh
    # worker's.
    # A fresh interpreter's starts as: what site's .pth files insert first (nvidia_cutlass_dsl's), PYTHONPATH, the
    # standard library and site-packages; then its script's directory goes first. This one's (-P: no script directory)
    # has this zygote's PYTHONPATH where the worker's goes.
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    stdlib = (os.path.dirname(os.__file__), f"python{sys.version_info.major}{sys.version_info.minor}.zip")
    first = next((i for i, p in enumerate(sys.path) if p in inherited or p == stdlib[0] or p.endswith(stdlib[1])),
                 len(sys.path))
    front, rest = sys.path[:first], [p for p in sys.path[first:] if p not in inherited]
    sys.path[:] = [kind["dir"], *front, *[p for p in kind["pythonpath"].split(os.pathsep) if p], *rest]
    borrowed = ROOT not in sys.path
    if borrowed:
        sys.path.append(ROOT)  # for PRELOAD's tests.support module and the hook, after the rest
    import importlib

    try:
        for module in PRELOAD:
            importlib.import_module(module)
        hook = kind["hook"]
        if hook:  # the job's setup hook, as its workers run it first, then what they import next
            module, name = hook.rsplit(".", 1)
            getattr(importlib.import_module(module), name)()
            for module in HOOK_PRELOAD[hook]:
                importlib.import_module(module)
    except BaseException:
        open(sock + ".failed", "w").close()  # noqa: SIM115
        raise
    if borrowed:
        sys.path.remove(ROOT)
    tmp = sock + f".{os.getpid()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(tmp)
    srv.listen(64)
    os.rename(tmp, sock)  # launchers connect only once it listens
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    print(f"zygote {os.getpid()} serving {sock} while process {owner} lives", flush=True)
    while True:
        ready, _, _ = select.select([srv, wake_r], [], [], 1.0)
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                with_signal = os.WIFSIGNALED(status)
                try:
                    _send(conn, {"signal": os.WTERMSIG(status)} if with_signal else {"exit": os.WEXITSTATUS(status)})
                except OSError:
                    pass
                conn.close()
        if srv in ready:
            conn, _ = srv.accept()
            try:
                req, fds = _recv(conn, want_fds=3)
            except OSError:
                conn.close()
                continue
            why = "bad request" if req is None or len(fds) != 3 else _why_cold(req, env0, kind)
            if why is not None:
                for fd in fds:
                    os.close(fd)
                try:
                    _send(conn, {"cold": why})
                except OSError:
                    pass
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for c in children.values():
                    c.close()
                srv.close()
                os.close(wake_r)
                os.close(wake_w)
                os.close(lock)  # the zygote's; a worker that outlives it must not keep the next one from starting
                try:
                    launcher = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
                    _become_worker(conn, launcher, req, fds)
                finally:
                    os._exit(1)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            try:
                _send(conn, {"pid": pid})
            except OSError:
                pass
        if not children and not _needed(sock, owner):
            return


def ray_cli(launcher: str, args: list[str]) -> None:
    """`ray ARGS` (the `ray` script's entry point) with `launcher` as the Python its raylet starts workers with."""
    from ray.scripts.scripts import main

    sys.executable = launcher
    sys.argv = ["ray", *args]
    main()


if __name__ == "__main__":
    if sys.argv[1] == "ray":
        ray_cli(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "launch":
        launch(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    elif sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5]))
