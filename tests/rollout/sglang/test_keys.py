"""An engine's port taken before the engine listens on it (by a neighbour on a shared node): the /health it answers is
not taken for the engine's. The start fails naming the port and the process that was started, the run's key never
reaches the squatter, and the started process is stopped. (Requests without the key against real engines and the
router: tests/rollout/sglang/test_weights.py.)"""

from __future__ import annotations

import contextlib
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slime_hydra.rollout.sglang.engines import EngineGroup, EngineStartError
from slime_hydra.rollout.sglang.process import ManagedProcess


@contextlib.contextmanager
def squatter():
    """A process of someone else's on a port: 200 to everything, and a record of each request's Authorization."""
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


class OnPort:
    """A launcher that starts engine 0 on the given port; its process is a stand-in that never listens (the real server
    would fail to bind there once loaded: either way the answer on the port is not the started process's)."""

    def __init__(self, port: int):
        self.port = port
        self.started: list[ManagedProcess] = []

    def launch(self, index, argv, log_path, env, port):
        p = ManagedProcess(f"engine-{index}", [sys.executable, "-c", "import time; time.sleep(600)"], log_path, env)
        self.started.append(p.start())
        return p, "127.0.0.1", self.port

    def shutdown(self):
        pass


@pytest.mark.integration  # starts server processes
def test_an_engine_port_taken_before_the_engine_listens_is_refused_and_gets_no_key(tmp_path: Path):
    with squatter() as (port, seen):
        launcher = OnPort(port)
        group = EngineGroup("unused-model", 1, 1, 0, {}, "round_robin", {}, tmp_path, start_timeout_s=60,
                            launcher=launcher)
        with pytest.raises(EngineStartError) as e:
            group.start()
    started = launcher.started[0]
    assert str(e.value) == (
        f"SGLang engine 0: http://127.0.0.1:{port}/health was answered by a process this run did not start: the socket "
        f"on port {port} is not the server's (pid {started.pid}). Another process took the port before the server could "
        "listen on it (on a shared node, another user's); nothing else was sent to it. Stop that process, or run again "
        "(each start picks free ports)")
    assert seen == [("/health", None)]  # one health check, without the key; nothing after it
    assert not started.alive()  # the started process was stopped with the group
    assert group.key not in (tmp_path / "engine_0.log").read_text()  # its start line: no key on the command line


def test_requests_to_an_engine_build_no_tls_context_each(monkeypatch):
    """Every request the runner sends an engine or router shares the process's one TLS context: building one parses the
    CA bundle (about 30 ms of CPU), and httpx builds one for each client it makes, which `httpx.post` does per request.
    Counted where any context loads its CAs, over a weight-sync request, a health check, an info query and a router call."""
    import ssl

    import httpx

    from slime_hydra.rollout.sglang import weights as W
    from slime_hydra.rollout.sglang.endpoint import Endpoint, tls
    from slime_hydra.rollout.sglang.engines import engine_info, ping
    from slime_hydra.rollout.sglang.external_router import ExternalRouter

    tls()  # the process's one, built before the count starts
    loads = []
    load = ssl.SSLContext.load_verify_locations
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", lambda self, *a, **k: loads.append(1) or load(self, *a, **k))
    with squatter() as (port, seen):
        endpoint = Endpoint(f"http://127.0.0.1:{port}", "k" * 43)
        for _ in range(3):
            assert W.post(endpoint, "/pause_generation", {}, 10).status_code == 200
            assert ping(endpoint.url)
            engine_info(endpoint, 10)
            assert ExternalRouter(endpoint, 10)._call("GET", "/workers").status_code == 200
    assert len(seen) == 12 and loads == []
    httpx.Client().close()  # the count sees a context built: a client made without `verify` builds its own
    assert loads == [1]


def test_the_key_is_the_runners_to_set():
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        compose_run(["experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1", "+rollout.sglang.api_key=mine",
                     "+rollout.sglang_router.api_key=mine"])
    assert "rollout.sglang.api_key is set by the runner and cannot be overridden: each run gives its engines a random " \
           "key of its own" in str(e.value)
    assert "rollout.sglang_router.api_key is set by the runner" in str(e.value)


def test_a_key_beginning_with_a_dash_reaches_the_routers_parser_as_the_key(monkeypatch):
    """token_urlsafe keys begin with "-" one time in 64; given as its own argument after --api-key, argparse reads it as
    an option and the process exits 2 while starting. The launcher passes `--api-key=KEY`, one token."""
    import runpy

    from sglang_router.launch_router import parse_router_args

    from slime_hydra.rollout.sglang import keyed
    from slime_hydra.rollout.sglang.endpoint import KEY_ENV

    key = "-Xk2" + "a" * 39
    ran = []
    monkeypatch.setenv(KEY_ENV, key)
    monkeypatch.setattr(sys, "argv", ["keyed", "sglang_router.launch_router", "--worker-urls", "http://127.0.0.1:1"])
    monkeypatch.setitem(sys.modules, "sglang", sys.modules.get("sglang"))  # the launcher blocks it: restored after
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(runpy, "run_module", lambda module, **kw: ran.append(list(sys.argv)))
    keyed.main()
    assert ran and key not in ran[0][1:-1] and ran[0][-1] == f"--api-key={key}"
    assert parse_router_args(ran[0][1:]).api_key == key


ROUTER_IMPORTS = """
import json, os, sys
from slime_hydra.rollout.sglang import keyed
os.environ[keyed.KEY_ENV] = "k" * 43
sys.argv = ["keyed", "sglang_router.launch_router", "--help"]
try:
    keyed.main()  # imports the router's module and its arguments' parser, which prints the help and exits
except SystemExit:
    pass
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules if m.startswith(("sglang.", "sglang_router."))})))
"""


def test_a_router_imports_sglang_only_for_the_python_load_balancer(monkeypatch):
    """The router (Rust) never calls SGLang's package; sglang_router imports it only for mini_lb's tracing. Checked in a
    fresh interpreter, as the router's own process starts; with --mini-lb, the launcher leaves SGLang importable."""
    import json
    import runpy
    import subprocess

    from slime_hydra.rollout.sglang import keyed
    from slime_hydra.rollout.sglang.endpoint import KEY_ENV

    out = subprocess.run([sys.executable, "-c", ROUTER_IMPORTS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout  # the router's parser ran
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["sglang_router"], out.stdout[-500:]

    seen = []
    monkeypatch.setenv(KEY_ENV, "k" * 43)
    monkeypatch.delitem(sys.modules, "sglang", raising=False)  # restored after
    monkeypatch.setattr(sys, "argv", ["keyed", "sglang_router.launch_router", "--mini-lb"])
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(runpy, "run_module", lambda module, **kw: seen.append(sys.modules.get("sglang", "importable")))
    keyed.main()
    assert seen == ["importable"]


def test_a_cpu_server_forks_its_children_and_a_gpu_server_spawns_them(monkeypatch):
    """SGLang asks for spawn (CUDA cannot be forked); a CPU server's scheduler and detokenizer are forked instead, so
    they start from the modules the server imported, and FlashInfer is left unimported. Every server leaves
    scikit-learn unimported. The engines the tests start run so (tests/rollout/sglang/)."""
    import importlib.util
    import multiprocessing
    import runpy

    from slime_hydra.rollout.sglang import keyed
    from slime_hydra.rollout.sglang.endpoint import KEY_ENV

    methods, flashinfer, sklearn = {}, {}, {}
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # what this process had is restored after the test
    monkeypatch.setitem(sys.modules, "sklearn", None)
    for device in ("cpu", "cuda"):
        sys.modules.pop("flashinfer")
        sys.modules.pop("sklearn")
        chosen = []  # what reaches multiprocessing (recorded, not set: this process keeps its own)
        monkeypatch.setattr(multiprocessing, "set_start_method", lambda method, force=False: chosen.append(method))
        monkeypatch.setenv(KEY_ENV, "k" * 43)
        monkeypatch.setattr(sys, "argv", ["keyed", "sglang.launch_server", "--model-path", "m", "--device", device])
        monkeypatch.setattr(sys, "stdout", sys.stdout)
        monkeypatch.setattr(sys, "stderr", sys.stderr)

        def server(module, **kw):  # what SGLang's launcher does first; and whether its import of FlashInfer can find it
            multiprocessing.set_start_method("spawn", force=True)
            flashinfer[device] = "blocked" if "flashinfer" in sys.modules and sys.modules["flashinfer"] is None else "free"
            sklearn[device] = importlib.util.find_spec("sklearn")  # transformers' check: None reads as not installed

        monkeypatch.setattr(runpy, "run_module", server)
        keyed.main()
        methods[device] = chosen
    assert methods == {"cpu": ["fork"], "cuda": ["spawn"]}
    # a CPU server reads FlashInfer (CUDA kernels only) as not installed (an import raises ImportError, which SGLang's
    # optional import of it falls back from); a GPU server imports it as usual
    assert flashinfer == {"cpu": "blocked", "cuda": "free"}
    assert sklearn == {"cpu": None, "cuda": None}
    assert keyed.on_cpu(["--device=cpu"]) and not keyed.on_cpu(["--device"]) and not keyed.on_cpu(["--model-path", "cpu"])
