"""Engine and router lifecycle: start, wait for health, monitor, restart.

One SGLang server process per engine (its tp size is cluster.rollout_num_gpus_per_engine), the real
sglang-router in front. The health monitor (`use_fault_tolerance`) checks each engine every
`rollout_health_check_interval` seconds, but only once the engine has answered /health for the first
time or `rollout_health_check_first_wait` seconds have passed since it was launched: a server that is
still loading is never killed for being slow (slime's 0-second first wait does that). An engine whose
process died, or that failed `rollout_health_check_max_failures` checks in a row, is killed and
relaunched on its port; `on_restart` (the backend's weight resync) runs before it is marked healthy. An engine that
misses a check (a slow answer on a loaded node) is out until it answers again: weight syncs skip it meanwhile, so it
too is resynced before it serves again.

Where a server process runs is the launcher's business (`Launcher`): `LocalLauncher` starts it as a
child of this process; under `cluster.backend=ray` the orchestration floor's launcher starts it inside a
Ray actor on the engine's bundle and hands back a handle with the same methods; `ExternalLauncher` starts nothing and
hands back a server someone else started (rollout.rollout_external_engine_addrs), which the run never stops. Either way
the engine has a URL, and everything else (router, generation, weight sync, health checks, restarts) goes over HTTP.
The router is started here, in front of the engines' URLs, unless the run attaches to one already running
(rollout.sglang_router_ip / rollout.sglang_router_port: `ExternalRouter`, which registers the engines with it).

The engines and the router run with this run's API key (endpoint.py) and are launched through keyed.py, so the key
is on no command line. A server counts as up once /health answers (without the key) and the socket on its port
belongs to the process that was started: a process that took the port first is an error naming it, and is sent
nothing else.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

import httpx

from slime_hydra.errors import RunError
from slime_hydra.rollout.sglang.endpoint import KEY_ENV, Endpoint, new_key, tls
from slime_hydra.rollout.sglang.external_router import ExternalRouter
from slime_hydra.rollout.sglang.process import ManagedProcess, free_port
from slime_hydra.rollout.sglang.server_args import to_argv

log = logging.getLogger(__name__)


class EngineStartError(RunError):
    pass


class ServerProcess(Protocol):
    """An engine's server process, wherever it runs (a ManagedProcess here, a Ray actor's elsewhere)."""

    log_path: Path

    @property
    def pid(self) -> Optional[int]: ...

    @property
    def returncode(self) -> Optional[int]: ...

    def alive(self) -> bool: ...

    def stop(self, grace_s: float = 10.0) -> None: ...

    def kill(self) -> None: ...

    def log_tail(self, n: int = 30) -> str: ...

    def listens_on(self, port: int) -> bool:
        """Whether the socket listening on `port` is this server's own."""


# argv(host, port): the server's command line once the launcher knows where it listens
Argv = Callable[[str, int], list[str]]


class Launcher(Protocol):
    def launch(self, index: int, argv: Argv, log_path: Path, env: dict[str, str],
               port: Optional[int]) -> tuple[ServerProcess, str, int]:
        """Start engine `index`'s server (on `port` when relaunching it; a free one otherwise) -> (process, host, port)."""

    def shutdown(self) -> None:
        """After every server was stopped: release what the launcher holds."""


class LocalLauncher:
    """Each server a child process of this one, on the loopback."""

    def __init__(self) -> None:
        self.ports: set[int] = set()

    def launch(self, index: int, argv: Argv, log_path: Path, env: dict[str, str],
               port: Optional[int]) -> tuple[ServerProcess, str, int]:
        if port is None:
            port = free_port(self.ports)
            self.ports.add(port)
        return ManagedProcess(f"sglang-engine-{index}", argv("127.0.0.1", port), log_path, env).start(), "127.0.0.1", port

    def shutdown(self) -> None:
        pass


def http_url(host: str, port: Optional[int]) -> str:
    """An IPv6 host in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ExternalServer:
    """An engine this run did not start (rollout.rollout_external_engine_addrs): no process of ours to stop, kill or read
    the log of. It counts as alive; the health monitor sees it fail its checks, and its "restart" waits for it to answer
    again (ExternalLauncher), then resyncs it. Its socket is the one the user named: `listens_on` trusts the address,
    and the key (which only the engines' owner has) is what the run checks (SGLangRollout.check_attached)."""

    pid: Optional[int] = None
    returncode: Optional[int] = None

    def __init__(self, url: str, log_path: Path) -> None:
        self.url, self.log_path = url, log_path

    def alive(self) -> bool:
        return True

    def stop(self, grace_s: float = 10.0) -> None:
        pass

    def kill(self) -> None:
        pass

    def log_tail(self, n: int = 30) -> str:
        return f"(an engine this run did not start: its log is where {self.url} was started)"

    def listens_on(self, port: int) -> bool:
        return True


class ExternalLauncher:
    """Engines already running at `addrs` ((host, port), one per engine): `launch` starts nothing and hands back the
    engine's address; a relaunch (the health monitor's, after failed checks) waits for it to answer again."""

    def __init__(self, addrs: list[tuple[str, int]]) -> None:
        self.addrs = list(addrs)

    def launch(self, index: int, argv: Argv, log_path: Path, env: dict[str, str],
               port: Optional[int]) -> tuple[ServerProcess, str, int]:
        host, port = self.addrs[index]
        return ExternalServer(http_url(host, port), log_path), host, port

    def shutdown(self) -> None:
        pass


@dataclass
class Engine:
    index: int
    argv: Argv
    log_path: Path
    launcher: Launcher
    host: str = "127.0.0.1"
    port: Optional[int] = None  # known once launched; a relaunch keeps it (the router's worker URL)
    process: Optional[ServerProcess] = None
    launched_at: float = 0.0
    ever_healthy: bool = False
    healthy: threading.Event = field(default_factory=threading.Event)  # serving, with the current weights
    failures: int = 0
    restarts: int = 0
    launches: int = 0
    env: dict = field(default_factory=dict, repr=False)  # holds the key (KEY_ENV) and rollout.sglang_env's secrets
    key: str = field(default="", repr=False)  # this run's API key (the server gets it in env[KEY_ENV])

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.url, self.key)

    def launch(self) -> None:
        self.healthy.clear()
        self.ever_healthy, self.failures = False, 0
        self.process, self.host, self.port = self.launcher.launch(self.index, self.argv, self.log_path, self.env, self.port)
        self.launched_at, self.launches = time.monotonic(), self.launches + 1


def ping(url: str, path: str = "/health", timeout: float = 5.0) -> bool:
    try:
        return httpx.get(url + path, timeout=timeout, verify=tls()).status_code == 200
    except httpx.HTTPError:
        return False


def server_memory(endpoint: Endpoint, timeout: float) -> dict[str, float]:
    """What an engine says it holds (its /server_info memory_usage, SGLang >= 0.5: GiB): the `perf/engine_*` figures
    `slime-hydra plan` predicts (weights, KV cache, CUDA graphs, the free memory it was sized from); {} if it does not."""
    try:
        usage = engine_info(endpoint, timeout)["internal_states"][0]["memory_usage"]
    except (EngineStartError, KeyError, IndexError, TypeError):
        return {}
    if not isinstance(usage, dict):
        return {}
    graph = usage.get("graph") or {}
    return {"perf/engine_weights_gib": float(usage.get("weight", 0.0)),
            "perf/engine_kv_cache_gib": float(usage.get("kvcache", 0.0)),
            "perf/engine_cuda_graphs_gib": float(sum(graph.values()) if isinstance(graph, dict) else graph or 0.0),
            "perf/engine_free_at_start_gib": float(usage.get("startup_available", 0.0)),
            "perf/engine_kv_tokens": float(usage.get("token_capacity", 0))}


def engine_info(endpoint: Endpoint, timeout: float) -> dict[str, Any]:
    """An engine's /server_info (its ServerArgs among the rest; /get_server_info before SGLang 0.5), asked with the key:
    an engine that refuses the key, or answers no such JSON, is an EngineStartError saying why."""
    for path in ("/server_info", "/get_server_info"):
        try:
            r = httpx.get(endpoint.url + path, headers=endpoint.headers, timeout=timeout, verify=tls())
        except httpx.HTTPError as e:
            raise EngineStartError(f"the engine at {endpoint.url} did not answer {path}: {e}") from None
        if r.status_code in (401, 403):
            raise EngineStartError(f"the engine at {endpoint.url} refused the key in ${KEY_ENV} (HTTP {r.status_code}): "
                                   "export the key the engine was started with (sglang.launch_server --api-key)")
        if r.status_code == 200:
            try:
                return r.json()
            except ValueError:
                raise EngineStartError(f"the engine at {endpoint.url} answered {path} with no JSON: is it an SGLang "
                                       "server?") from None
    raise EngineStartError(f"the engine at {endpoint.url} answered neither /server_info nor /get_server_info "
                           f"(HTTP {r.status_code}): is it an SGLang server?")


def same_option(engine: Any, run: Any) -> bool:
    """An engine's ServerArgs value against the run's (YAML: 0.5 and 1 for 0.5 and 1.0, a number given as a string)."""
    if isinstance(engine, (int, float)) and not isinstance(engine, bool) and isinstance(run, (int, float, str)) \
            and not isinstance(run, bool):
        try:
            return float(engine) == float(run)
        except ValueError:
            return False
    return engine == run or str(engine) == str(run)


def wait_healthy(proc: ServerProcess, url: str, timeout_s: float, what: str) -> None:
    """/health answered (no key sent) by `proc` itself; a process that took its port first is an EngineStartError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise EngineStartError(f"{what} exited with code {proc.returncode} while starting; log {proc.log_path}:\n"
                                   f"{proc.log_tail()}")
        if ping(url):
            if not proc.listens_on(port_of(url)):
                raise EngineStartError(squatted(what, url, proc.pid))
            return
        time.sleep(0.5)
    raise EngineStartError(f"{what} did not answer {url}/health within {timeout_s:.0f} s (raise "
                           f"rollout.sglang_server_start_timeout_s); log {proc.log_path}:\n{proc.log_tail()}")


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def squatted(what: str, url: str, pid: Optional[int]) -> str:
    return (f"{what}: {url}/health was answered by a process this run did not start: the socket on port {port_of(url)} "
            f"is not the server's (pid {pid}). Another process took the port before the server could listen on it (on "
            "a shared node, another user's); nothing else was sent to it. Stop that process, or run again (each start "
            "picks free ports)")


def wait_routed(router: Endpoint, body: dict[str, Any], timeout_s: float, router_log: str) -> None:
    """The router answers /health before it routes: its first /generate can be 503 no_available_workers, or hang
    in front of an engine that is up but does not generate. One deadline for all of it: the start timeout's."""
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while (left := deadline - time.monotonic()) > 0:
        try:
            r = httpx.post(router.url + "/generate", json=body, headers=router.headers, timeout=min(30.0, max(left, 0.1)),
                           verify=tls())
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code} {r.text[:200]}"
        except httpx.HTTPError as e:
            last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))
    raise EngineStartError(f"sglang-router at {router.url} did not route its first request within {timeout_s:g} s "
                           f"({last}; raise rollout.sglang_server_start_timeout_s if the engines are only slow); "
                           f"{router_log}")


KEYED = [sys.executable, "-m", "slime_hydra.rollout.sglang.keyed"]  # the key: from the environment, not argv


def engine_argv(model_path: str, tp_size: int, seed: int, options: dict[str, Any], host: str, port: int) -> list[str]:
    """(The interpreter is the one running this: under Ray, the engine actor's, the same environment.)"""
    return [*KEYED, "sglang.launch_server", "--model-path", model_path, "--tp-size", str(tp_size),
            "--host", host, "--port", str(port), "--random-seed", str(seed), *to_argv(options)]


class EngineGroup:
    def __init__(self, model_path: str, num_engines: int, tp_size: int, seed: int, options: dict[str, Any],
                 router_policy: str, router_options: dict[str, Any], log_dir: Path, start_timeout_s: float,
                 env: dict[str, str] | None = None, launcher: Optional[Launcher] = None, key: Optional[str] = None,
                 external_router: Optional[ExternalRouter] = None):
        """key: the engines' API key when they are not this run's (ExternalLauncher); a new one per run otherwise.
        external_router: a router already running, which the engines are registered with (none is started then)."""
        self.log_dir, self.start_timeout_s = Path(log_dir), start_timeout_s
        self.launcher: Launcher = launcher if launcher is not None else LocalLauncher()
        self.key = key or new_key()  # the engines' and the router's
        env = {k: str(v) for k, v in (env or {}).items()} | {KEY_ENV: self.key}
        self.engines = [Engine(i, partial(engine_argv, model_path, tp_size, seed + i, options), self.log_dir / f"engine_{i}.log",
                               self.launcher, env=dict(env), key=self.key) for i in range(num_engines)]
        self.router_policy, self.router_options = router_policy, dict(router_options)
        self.router_port: Optional[int] = None
        self.router: Optional[ManagedProcess] = None
        self.external_router = external_router
        self._monitor: Optional[threading.Thread] = None
        self._stop = threading.Event()

    @property
    def router_url(self) -> str:
        return self.router_endpoint.url

    @property
    def router_endpoint(self) -> Endpoint:
        if self.external_router is not None:
            return self.external_router.endpoint
        return Endpoint(f"http://127.0.0.1:{self.router_port}", self.key)

    @property
    def router_log(self) -> str:
        if self.external_router is not None:
            return self.external_router.log_hint
        return f"log {self.log_dir / 'router.log'}"

    def _router_argv(self) -> list[str]:
        """The router runs here, in front of the engines' URLs (known once they are launched)."""
        ports = {e.port for e in self.engines}
        self.router_port = free_port(ports)
        # the router's Prometheus exporter binds 0.0.0.0:29000 unless told otherwise: a second run on the host
        # (another test, a benchmark) then fails to start its router; a free loopback port unless the user set one
        options = {"prometheus_port": free_port(ports | {self.router_port}), "prometheus_host": "127.0.0.1",
                   **self.router_options}
        return [*KEYED, "sglang_router.launch_router", "--worker-urls", *[e.url for e in self.engines],
                "--host", "127.0.0.1", "--port", str(self.router_port), "--policy", self.router_policy, *to_argv(options)]

    def start(self, check: Optional[Callable[[list[Engine]], None]] = None) -> None:
        """All engines start at once (they load in parallel), then the router in front of them (or they are registered
        with the router already running). check(engines): once every engine answers, before any router routes to them
        (an error there stops the group)."""
        try:
            for e in self.engines:
                e.launch()
            for e in self.engines:
                wait_healthy(e.process, e.url, self.start_timeout_s, f"SGLang engine {e.index}")
                e.ever_healthy = True
                e.healthy.set()
            if check is not None:
                check(self.engines)
            if self.external_router is not None:
                self.external_router.register([e.endpoint for e in self.engines])
                return
            self.router = ManagedProcess("sglang-router", self._router_argv(), self.log_dir / "router.log",
                                         {KEY_ENV: self.key}).start()
            wait_healthy(self.router, self.router_url, self.start_timeout_s, "sglang-router")
        except BaseException:
            self.shutdown()
            raise

    def start_monitor(self, interval_s: float, first_wait_s: float, max_failures: int,
                      on_restart: Callable[[Engine], None]) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                for e in self.engines:
                    if self._stop.is_set():
                        return
                    self._check(e, first_wait_s, max_failures, on_restart)

        self._monitor = threading.Thread(target=loop, name="sglang-health", daemon=True)
        self._monitor.start()

    def _check(self, e: Engine, first_wait_s: float, max_failures: int, on_restart: Callable[[Engine], None]) -> None:
        dead = not e.process.alive()
        if not dead and not e.ever_healthy and time.monotonic() - e.launched_at < first_wait_s:
            if self._answers_itself(e):  # still inside the first wait: only watch for the first /health
                self._serve_again(e, on_restart)
            return
        if not dead and (ping(e.url) if e.ever_healthy else self._answers_itself(e)):
            e.failures = 0
            if not e.healthy.is_set():  # relaunched, or back after missed checks (a slow answer under load): weight
                self._serve_again(e, on_restart)  # syncs skipped it while it was out, so it is resynced before it serves
            return
        e.failures += 1
        e.healthy.clear()
        if dead or e.failures >= max_failures:
            if isinstance(e.process, ExternalServer):  # not this run's to restart: "relaunched", it is waited for
                log.warning("sglang engine %d (%s, not started by this run) failed %d health checks; waiting for it to "
                            "answer again, then resyncing it", e.index, e.url, e.failures)
            else:
                log.warning("sglang engine %d %s; restarting it (log %s)", e.index,
                            "exited" if dead else f"failed {e.failures} health checks", e.log_path)
            e.process.stop(grace_s=2.0)
            e.restarts += 1
            e.launch()

    @staticmethod
    def _answers_itself(e: Engine) -> bool:
        """A relaunched engine's /health, from its own process (its port was free while it was down): only then does it
        get the weights, and the key with them."""
        if not ping(e.url):
            return False
        if e.process.listens_on(e.port):
            return True
        log.warning("%s", squatted(f"sglang engine {e.index} (relaunched)", e.url, e.process.pid))
        return False

    def _serve_again(self, e: Engine, on_restart: Callable[[Engine], None]) -> None:
        e.ever_healthy = True
        try:
            on_restart(e)  # weight resync before it serves
        except Exception as exc:  # noqa: BLE001 - next check retries
            log.warning("sglang engine %d: weight resync after restart failed (%s); will retry", e.index, exc)
            e.ever_healthy = False
            return
        e.failures = 0
        e.healthy.set()
        log.warning("sglang engine %d is serving again (restarts: %d)", e.index, e.restarts)

    def shutdown(self) -> None:
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=10)
        if self.external_router is not None:  # before the engines stop: the router no longer sends them anything
            self.external_router.remove()
        # all at once: an engine told to stop waits ~5 s for its crash diagnostics before it exits; nothing
        # of its state is kept, so 3 s of grace, then SIGKILL
        procs = [p for p in [self.router, *(e.process for e in self.engines)] if p is not None]
        stoppers = [threading.Thread(target=p.stop, kwargs={"grace_s": 3.0}, daemon=True) for p in procs]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        self.launcher.shutdown()
