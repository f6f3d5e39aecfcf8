"""Real servers on loopback for the tests, each started once per test session and shared by every module.

- `mlflow_server`: `mlflow server` on a free port, sqlite store, one worker, proxied artifacts.
- `ray_head`: `ray start --head --block` with the dashboard (job submission) and 16 logical CPUs, its own temp dir,
  token auth (the session's token, tests/conftest.py) and every server on 127.0.0.1.
  Modules join it with `ray.init(address=..., namespace=<module>)`; a module that needs a cluster of its own
  shape gets a namespace and its own placement groups on this one, not a new head.

Under pytest-xdist the workers share them: the first worker that asks starts the server under a file lock and
writes its address beside the lock (in the run's shared base temp dir); the others read it. Servers run in their
own process session, so a worker's exit does not stop them; the controller (or a run without xdist) stops them
all at the end of the session by their recorded process ids (never `ray stop`, which stops every Ray cluster on
the machine, other users' included).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from slime_hydra import ports
from tests.support import ray_worker_zygote

BIN = Path(sys.executable).parent
RAY_HEAD_CPUS = 16  # logical: enough for the modules that run side by side (8 for the megatron + SGLang module)


def free_port() -> int:
    return ports.free_port()


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports (slime_hydra/ports.py: outside the kernel's ephemeral range, so no outgoing connection
    takes one between the pick and the server's bind); Ray refuses a port given to two components."""
    return ports.free_ports(n)


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float, headers: dict | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not up within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the server (it stops what it started), then SIGKILL whatever is left of its own session."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session we created with start_new_session: only our processes
    except ProcessLookupError:
        pass
    proc.wait(10)


def _stop_pid(pid: int, grace: float = 30.0) -> None:
    """_stop for a server another process started (an xdist worker): SIGTERM its session, then SIGKILL what is left."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _start(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    out = log.open("w")
    return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})


# -- one server per test session, shared by the xdist workers --------------------------------------------------------

def shared_root(config: pytest.Config) -> Path:
    """The run's base temp dir: an xdist worker's is <controller's>/popen-gwN, so its parent is the one they share."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return base.parent if hasattr(config, "workerinput") else base


def _shared(config: pytest.Config, name: str, start: Callable[[], dict]) -> dict:
    """The record of server `name` ({"pid": ..., ...}): started by `start` once for the session, under a file lock."""
    from filelock import FileLock

    root = shared_root(config)
    record = root / f"server_{name}.json"
    with FileLock(str(root / f"server_{name}.lock"), timeout=600):
        if record.exists():
            info = json.loads(record.read_text())
            if _alive(info["pid"]):
                return info
            raise RuntimeError(f"the session's {name} server (pid {info['pid']}) has died; its log: {info.get('log')}")
        info = start()
        record.write_text(json.dumps(info))
        return info


def stop_shared(config: pytest.Config) -> None:
    """Stop every server this session started (called once, by the controller or the only process)."""
    root = shared_root(config)
    for record in sorted(root.glob("server_*.json")):
        info = json.loads(record.read_text())
        _stop_pid(info["pid"])
        if info.get("cleanup"):
            shutil.rmtree(info["cleanup"], ignore_errors=True)
        record.unlink()


def _start_mlflow(root: Path) -> dict:
    port = free_port()
    log = root / "server.log"
    proc = _start([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
                   "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
                   "--workers", "1"], log,
                  env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no background job runner processes
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", proc, log, timeout=180)
    except BaseException:
        _stop(proc)
        raise
    return {"pid": proc.pid, "uri": f"http://127.0.0.1:{port}", "log": str(log)}


@pytest.fixture(scope="session")
def mlflow_server(request):
    """The tracking URI (http://127.0.0.1:PORT) of a real `mlflow server`; its store is sqlite under a temp dir."""
    root = shared_root(request.config) / "mlflow_server"
    root.mkdir(exist_ok=True)
    return _shared(request.config, "mlflow", lambda: _start_mlflow(root))["uri"]


@dataclass(frozen=True)
class RayHead:
    gcs_address: str  # for ray.init(address=...) / cluster.address
    dashboard_url: str  # for `ray job submit --address`
    temp_dir: str


def _start_ray_head() -> dict:
    temp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # AF_UNIX socket paths under it must stay < 107 bytes
    flags = ("--ray-client-server-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
             "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port")
    port, dash, *rest = free_ports(2 + len(flags))
    ports = {flag: str(p) for flag, p in zip(flags, rest)}  # defaults are fixed numbers: avoid clashes
    # its raylet starts workers forked from a warm interpreter where a fresh one would do (ray_worker_zygote.py)
    args = [sys.executable, "-P", ray_worker_zygote.__file__, "ray", ray_worker_zygote.launcher_script(temp), "start", "--head",
            "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
            "--num-cpus", str(RAY_HEAD_CPUS), "--num-gpus", "0", "--object-store-memory", str(400 * 2**20),
            "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
            "--temp-dir", temp, "--disable-usage-stats", *[x for kv in ports.items() for x in kv]]
    log = Path(temp) / "ray_start.log"
    # token auth (the session's RAY_AUTH_TOKEN, inherited) and every server on the loopback, as conftest.py sets
    proc = _start(args, log, env={"RAY_TMPDIR": temp, "RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    try:
        _wait_http(f"http://127.0.0.1:{dash}/api/version", proc, log, timeout=180,
                   headers={"Authorization": f"Bearer {os.environ['RAY_AUTH_TOKEN']}"})  # the dashboard asks for it too
        # jobs go through the head node's dashboard agent, which comes up later ("No available agent to submit job")
        _wait_port(int(ports["--dashboard-agent-listen-port"]), proc, log, timeout=180)
    except BaseException:
        _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)
        raise
    head = RayHead(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}", temp)
    return {"pid": proc.pid, "log": str(log), "cleanup": temp, "head": asdict(head)}


def ray_worker_starts(config: pytest.Config) -> tuple[int, int]:
    """(forked, started cold): the worker processes the session's head has started so far (none if it has not run)."""
    record = shared_root(config) / "server_ray_head.json"
    if not record.exists():
        return 0, 0
    return ray_worker_zygote.launch_counts(json.loads(record.read_text())["head"]["temp_dir"])


@pytest.fixture(scope="session")
def ray_head(request):
    """The session's `ray start --head` cluster on loopback (16 logical CPUs, no GPUs), with the dashboard."""
    return RayHead(**_shared(request.config, "ray_head", _start_ray_head)["head"])


def join_ray(head: RayHead, namespace: str, log_to_driver: bool = True, **runtime_env) -> None:
    """This process joins the session's cluster as a job in its own namespace (actors named in one module cannot
    collide with another's); `runtime_env` as ray.init takes it. Any earlier connection of this process is closed."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address=head.gcs_address, namespace=namespace, logging_level="WARNING", log_to_driver=log_to_driver,
             **({"runtime_env": runtime_env} if runtime_env else {}))


# -- one SGLang CPU engine per test process, shared by its modules ---------------------------------------------------

@contextlib.contextmanager
def serving(name: str, argv: list[str], log_path: Path, env: dict, port: int, timeout_s: float):
    """A server process of this test process (slime_hydra's ManagedProcess), once /health on `port` answers."""
    from slime_hydra.rollout.sglang.engines import wait_healthy
    from slime_hydra.rollout.sglang.process import ManagedProcess

    proc = ManagedProcess(name, argv, log_path, env).start()
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", timeout_s, f"the test process's {name}")
        yield proc
    finally:
        proc.stop(grace_s=3.0)


def keyed_for_module(var: str, shared):
    """`shared` for one module, with its key in the environment variable a run reads it from."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(var, shared.key)
        yield shared


SHARED_ENGINE_EXPERIMENT = "experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1"


@dataclass(frozen=True)
class SharedEngine:
    """A running SGLang engine this test process started, for runs that attach to it (rollout.rollout_external_engine_addrs)."""

    addr: str  # 127.0.0.1:PORT
    pid: int
    log_path: Path
    model_dir: Path  # what it loaded: the tiny model, seed of the experiment
    key: str = field(repr=False)

    @property
    def override(self) -> str:
        return f"rollout.rollout_external_engine_addrs=[{self.addr}]"

    @property
    def endpoint(self):
        from slime_hydra.rollout.sglang.endpoint import Endpoint

        return Endpoint(f"http://{self.addr}", self.key)


@pytest.fixture(scope="session")
def sglang_engine(tmp_path_factory):
    """An SGLang CPU engine started on first use and kept for the test process (an xdist worker runs one module at a
    time, so its modules take turns): the shipped CPU experiment's engine options and model, its own random key, started
    as a user would (slime_hydra's keyed launcher, the key in its environment). Each run that attaches to it resets its
    weights to the run's model and checks them (SGLangRollout.attach), so no module sees another's trained weights."""
    from slime_hydra.app.inputs import prepare
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.models.build import build_model
    from slime_hydra.rollout.sglang.endpoint import KEY_ENV, new_key
    from slime_hydra.rollout.sglang.engines import engine_argv

    root = tmp_path_factory.mktemp("shared_sglang_engine")
    cfg = compose_run([SHARED_ENGINE_EXPERIMENT])
    inputs = prepare(cfg)
    model_dir = root / "model"
    build_model(inputs.model, inputs.tokenizer, cfg.seed).save_pretrained(model_dir, safe_serialization=True)
    inputs.tokenizer.save_pretrained(model_dir)
    port, key = free_port(), new_key()
    argv = engine_argv(str(model_dir), 1, cfg.seed, {"dtype": cfg.model.dtype, **cfg.rollout.sglang}, "127.0.0.1", port)
    env = {**cfg.rollout.sglang_env, KEY_ENV: key}
    with serving("shared-sglang-engine", argv, root / "engine.log", env, port, 600) as proc:
        yield SharedEngine(f"127.0.0.1:{port}", proc.pid, root / "engine.log", model_dir, key)


@pytest.fixture(scope="module")
def external_engine(sglang_engine):
    """The shared engine for one module, its key where a run reads it ($SLIME_HYDRA_SGLANG_API_KEY)."""
    from slime_hydra.rollout.sglang.endpoint import KEY_ENV

    yield from keyed_for_module(KEY_ENV, sglang_engine)


# -- one sglang-router per test process, in front of nothing until a run registers its engines -----------------------

@dataclass(frozen=True)
class SharedRouter:
    """A running sglang-router this test process started, for runs that attach to it (rollout.sglang_router_ip/port)."""

    host: str
    port: int
    pid: int
    log_path: Path
    key: str = field(repr=False)

    @property
    def overrides(self) -> list[str]:
        return [f"rollout.sglang_router_ip={self.host}", f"rollout.sglang_router_port={self.port}"]

    @property
    def endpoint(self):
        from slime_hydra.rollout.sglang.endpoint import Endpoint

        return Endpoint(f"http://{self.host}:{self.port}", self.key)


@pytest.fixture(scope="session")
def sglang_router(tmp_path_factory):
    """An sglang-router started on first use and kept for the test process, as a user starts one (slime_hydra's keyed
    launcher, its own random key, loopback, no workers): each run that attaches registers its engines and removes them
    when it ends, so the next module finds it empty (checked: a run refuses a router that routes to anything else)."""
    from slime_hydra.rollout.sglang.endpoint import KEY_ENV, new_key
    from slime_hydra.rollout.sglang.engines import KEYED

    root = tmp_path_factory.mktemp("shared_sglang_router")
    port, prometheus = free_ports(2)
    key = new_key()
    argv = [*KEYED, "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus)]
    with serving("shared-sglang-router", argv, root / "router.log", {KEY_ENV: key}, port, 120) as proc:
        yield SharedRouter("127.0.0.1", port, proc.pid, root / "router.log", key)


@pytest.fixture(scope="module")
def external_router(sglang_router):
    """The shared router for one module, its key where a run reads it ($SLIME_HYDRA_SGLANG_ROUTER_API_KEY)."""
    from slime_hydra.rollout.sglang.endpoint import ROUTER_KEY_ENV

    yield from keyed_for_module(ROUTER_KEY_ENV, sglang_router)
