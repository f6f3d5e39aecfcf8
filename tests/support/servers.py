"""Real servers on loopback for the tests, each started once per session and shared.

- `mlflow_server`: `mlflow server` on a free port, sqlite store, one worker, proxied artifacts.
- `ray_head`: `ray start --head --block` with the dashboard (job submission), 2 CPUs, its own temp dir.

Each runs in its own process session and is stopped by its own process id (never `ray stop`, which
stops every Ray cluster on the machine, other users' included).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
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


def _start(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    out = log.open("w")
    return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """The tracking URI (http://127.0.0.1:PORT) of a real `mlflow server`; its store is sqlite under a temp dir."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    proc = _start([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
                   "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
                   "--workers", "1"], root / "server.log",
                  env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no background job runner processes
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", proc, root / "server.log", timeout=180)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


@dataclass(frozen=True)
class RayHead:
    gcs_address: str  # for ray.init(address=...) / cluster.address
    dashboard_url: str  # for `ray job submit --address`
    temp_dir: str


@pytest.fixture(scope="session")
def ray_head():
    """A `ray start --head` cluster of 2 CPUs on loopback, with the dashboard (job submission)."""
    temp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # AF_UNIX socket paths under it must stay < 107 bytes
    port, dash = free_port(), free_port()
    ports = {flag: str(free_port()) for flag in ("--ray-client-server-port", "--dashboard-agent-listen-port",
                                                 "--dashboard-agent-grpc-port", "--metrics-export-port",
                                                 "--runtime-env-agent-port")}  # defaults are fixed numbers: avoid clashes
    args = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
            "--num-cpus", "2", "--num-gpus", "0", "--object-store-memory", str(200 * 2**20), "--include-dashboard", "true",
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--temp-dir", temp, "--disable-usage-stats",
            *[x for kv in ports.items() for x in kv]]
    log = Path(temp) / "ray_start.log"
    proc = _start(args, log, env={"RAY_TMPDIR": temp, "RAY_AUTH_MODE": "disabled"})
    try:
        _wait_http(f"http://127.0.0.1:{dash}/api/version", proc, log, timeout=180)
        # jobs go through the head node's dashboard agent, which comes up later ("No available agent to submit job")
        _wait_port(int(ports["--dashboard-agent-listen-port"]), proc, log, timeout=180)
        yield RayHead(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}", temp)
    finally:
        _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)
