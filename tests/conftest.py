"""Shared fixtures: an isolated working directory for every test, and the session's real servers (started once per
session, shared by the xdist workers, stopped at the end). Plain helpers (the CLI, MLflow stores, the tiny model and
batch) live in tests/support/."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning. The tier runs two xdist workers beside servers and CLI children on two
# cores, each torch process with two intra-op threads: spinning threads take the cores from the others (measured: two
# short embedded runs side by side, 125 s spinning, 31 s passive; alone 23 s and 33 s). The thread count, and so every
# number, is unchanged. Set before torch is imported here; servers and children inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One intra-op thread per process. The tier runs more torch processes than it has cores, so a second thread per
# process mostly competes with the others. The embedded default's learning test alone, on two idle cores: 69-70 CPU-s
# and 72-74 s with torch's two threads, 50-54 CPU-s and 51-52 s with one, the same figures to the digit (held-out
# 0.26 -> 0.365). Ray's rank actors and local engine actors already take one (cluster.num_threads' default under
# Ray); this gives the test processes, CLI runs, spawned ranks and SGLang servers the same. Set before torch is imported anywhere in the session; a value in the shell wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.*` importable from conftest however pytest was started
    sys.path.insert(0, str(ROOT))
from tests.support import servers  # noqa: E402
from tests.support.servers import (  # noqa: E402,F401  (real servers on loopback)
    external_engine,
    external_router,
    mlflow_server,
    ray_head,
    sglang_engine,
    sglang_router,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every Ray cluster of the session runs as a run's own does (orchestration/local_cluster.py): token auth, with one
# token for the session (the xdist workers, started after this, inherit it; so do the head node and every child), and
# every server on the loopback (a 127.0.0.1 address is then joined there, not at the node's outside IP).
# Set before Ray is imported: it reads both once.
os.environ["RAY_AUTH_MODE"] = "token"
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from tests.support import ray_worker_zygote, warm_cli, warm_spawn  # noqa: E402
from tests.support.runs import CLI_STARTS, cli_env  # noqa: E402

STARTS = {"cli_starts": CLI_STARTS, "rank_starts": warm_spawn.STARTS}  # counted per process, summed by the controller
RAY_WORKERS: list[int] = []  # [forked, started cold]: the Ray worker processes of the session (launch logs)

# CLI runs in this environment fork from a warm interpreter (tests/support/warm_cli.py); any other gets a fresh one
warm_cli.SESSION_ENV.update(cli_env())


def ray_python_dir(config: pytest.Config) -> Path:
    """Where the session's launcher for Ray workers of clusters other than the head lives, with its zygotes."""
    return servers.shared_root(config) / "ray_python"


@pytest.fixture(scope="session", autouse=True)
def ray_python(request):
    """The Python that local Ray clusters of the session's CLI runs (warm_cli.RAY_PYTHON) and of its modules (a test
    that starts one sets sys.executable to it first) start their workers with: forked from a warm interpreter where
    a fresh one would do (tests/support/ray_worker_zygote.py). Its zygotes end with the session's controller."""
    directory = ray_python_dir(request.config)
    directory.mkdir(exist_ok=True)
    controller = os.getppid() if hasattr(request.config, "workerinput") else os.getpid()
    path = ray_worker_zygote.launcher_script(str(directory), owner=controller)
    warm_cli.RAY_PYTHON[:] = [path]
    return path


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):  # an xdist worker: its counts go to the controller
        session.config.workeroutput.update({name: dict(counts) for name, counts in STARTS.items()})
    else:  # the xdist controller, or a run without xdist: after every worker
        head = servers.ray_worker_starts(session.config)  # read before the head's temp dir goes
        other = ray_worker_zygote.launch_counts(str(ray_python_dir(session.config)))
        RAY_WORKERS.extend([head[0] + other[0], head[1] + other[1]])
        ray_worker_zygote.stop_zygotes(str(ray_python_dir(session.config)))
        servers.stop_shared(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # the xdist controller, as each worker ends
    for name, counts in STARTS.items():
        for how, n in getattr(node, "workeroutput", {}).get(name, {}).items():
            counts[how] += n


def pytest_terminal_summary(terminalreporter):
    """How the session's CLI runs, spawned rank processes and Ray workers started: a cold start where a fork would do
    costs 1 to 6 CPU-seconds more."""
    if sum(CLI_STARTS.values()):
        terminalreporter.write_line(f"CLI runs: {CLI_STARTS['warm']} forked from the warm interpreter, {CLI_STARTS['cold']} "
                                    "started cold (an environment of their own, or a test's own interpreter)")
    ranks = warm_spawn.STARTS
    if sum(ranks.values()):
        terminalreporter.write_line(f"Spawned rank processes: {ranks['warm']} forked from the warm interpreter, "
                                    f"{ranks['cold']} started cold")
    if sum(RAY_WORKERS):
        terminalreporter.write_line(f"Ray workers (the session's head, local clusters): {RAY_WORKERS[0]} forked from a "
                                    f"warm interpreter, {RAY_WORKERS[1]} started cold (tests/support/ray_worker_zygote.py)")


# Modules that start engines, rank groups or whole CLI runs, longest first, with their seconds in one sequential
# run of the tier (`pytest --durations=0`, 2-core machine). Under xdist (`make test`: two workers, whole files, in
# collection order) the long modules start first, so the tier does not end waiting on one of them.
LONG_MODULES = {
    "tests/orchestration/test_megatron_sglang.py": 345, "tests/rollout/sglang/test_backend.py": 313,
    "tests/orchestration/test_sglang_engines.py": 252, "tests/orchestration/test_megatron_group.py": 118,
    "tests/engine/test_checkpoint.py": 111, "tests/training/megatron/test_critic.py": 110,
    "tests/engine/test_watchdog.py": 89, "tests/training/test_packing.py": 79, "tests/orchestration/test_ray_backend.py": 79,
    "tests/config/test_experiments.py": 77, "tests/app/test_stop.py": 73,
    "tests/tracking/test_store.py": 47,
    # measured alone (`-n 0`) beside other work on the 2-core machine, before their first tier run
    "tests/orchestration/test_multi_node.py": 305, "tests/e2e/test_step_hooks.py": 250,
    "tests/training/megatron/test_moe_experiment.py": 248, "tests/training/megatron/test_expert_parallel.py": 137,
    "tests/orchestration/test_ray_rollout_hooks.py": 63,
    # runs attached to the test process's shared SGLang engine and router (tests/support/servers.py): the first of
    # them on a worker also waits ~17 s for the engine to start, ~6 s for the router
    "tests/rollout/sglang/test_post_write.py": 32, "tests/rollout/sglang/test_weights.py": 33,
    "tests/rollout/sglang/test_external_engines.py": 42, "tests/rollout/sglang/test_external_router.py": 20,
}


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -LONG_MODULES.get(item.nodeid.split("::", 1)[0], 0))  # stable: the rest keep their order
