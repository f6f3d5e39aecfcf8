"""Helpers for tests that run the program: the repository root, the CLI as a user runs it, a real MLflow store,
the small fast overrides of the embedded default, and validation's problem list."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime_hydra.errors import ConfigError
from tests.support import warm_cli

ROOT = Path(__file__).resolve().parents[2]
# every shipped experiment, as `experiment=<name>` takes it
EXPERIMENTS = sorted(str(p.relative_to(ROOT / "experiments").with_suffix("")) for p in (ROOT / "experiments").rglob("*.yaml"))

_MLFLOW_TEMPLATE: list[Path] = []


def mlflow_db(path: Path) -> str:
    """A real, empty MLflow sqlite store at `path`; returns its tracking URI. The store's schema migrations
    (~4 s) run once per session into a template that each call copies."""
    import atexit
    import shutil
    import tempfile

    if not _MLFLOW_TEMPLATE:
        from mlflow.tracking import MlflowClient

        template = Path(tempfile.mkdtemp(prefix="mlflow_template_")) / "mlflow.db"
        atexit.register(shutil.rmtree, template.parent, ignore_errors=True)
        MlflowClient(f"sqlite:///{template}").search_experiments()  # creates the tables
        _MLFLOW_TEMPLATE.append(template)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_MLFLOW_TEMPLATE[0], path)
    return f"sqlite:///{path}"


# set by init_parallel in this process once an in-process backend ran (and its port still bound by that store): a CLI
# child that inherited them would try to listen on the same port for its own process group
DIST_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
# written into this process's environment by the libraries the tests use in-process (found by diffing os.environ after
# each test of the unit layer, and from the keys a tier run named): `import ray` sets RAY_CLIENT_MODE=0 (its default) and ray.init PYTHONBREAKPOINT (its driver's
# debugger hook); torch's inductor its cache directory and, when it compiles, the KMP_* OpenMP switches; megatron-core
# the NVTE_* attention switches; SGLang's imports its kernel caches and DeepGEMM's and TensorRT-LLM's settings; MLflow
# its telemetry session; wandb its service.
# A user's shell has none of them; a CLI child gets each as it was when this module was first imported (by conftest,
# before any test ran). Inherited, they also sent every later CLI run of the xdist worker to a cold interpreter: its
# environment no longer matched the one the warm interpreter imported under (every CLI run of the whole tier, 58 of
# 58, before the last three keys joined). A key a library adds later shows as cold runs in the session's summary line.
LIBRARY_SET_ENV = ("RAY_CLIENT_MODE", "PYTHONBREAKPOINT",
                   "TORCHINDUCTOR_CACHE_DIR", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK",
                   "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN",
                   "TRITON_CACHE_DIR", "TRITON_PTXAS_BLACKWELL_PATH", "CUTE_DSL_CACHE_DIR", "CUDA_CACHE_PATH",
                   "TILELANG_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "DG_JIT_CACHE_DIR", "DG_JIT_USE_NVRTC", "TLLM_LOG_LEVEL",
                   "_MLFLOW_TELEMETRY_SESSION_ID", "WANDB_SERVICE")
_LIBRARY_SET_ENV_AT_START = {k: os.environ[k] for k in LIBRARY_SET_ENV if k in os.environ}


def cli_env() -> dict[str, str]:
    """This process's environment for a CLI child: unbuffered, this checkout first on the path, no distributed rendezvous."""
    drop = (*DIST_ENV, *LIBRARY_SET_ENV)
    env = {k: v for k, v in os.environ.items() if k not in drop} | _LIBRARY_SET_ENV_AT_START
    path = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return env | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}


# the modules whose `python -m` a CLI run may fork from the warm interpreter (the CLI, and the same under the CPU shim)
WARM_MODULES = ("slime_hydra", "tests.support.megatron_cpu.cli")
# this process's CLI runs by how they started: forked from the warm interpreter, or a fresh one (an environment of
# their own); the session prints the sums (conftest.py)
CLI_STARTS = {"warm": 0, "cold": 0}


def run_cli(args: list[str], cwd: Path, timeout: int = 600, module: str = "slime_hydra") -> subprocess.CompletedProcess:
    """`python -m slime_hydra ARGS` in `cwd`, as a user would run it (module=tests.support.megatron_cpu.cli: the same
    under the CPU shim for megatron-core). In the session's own environment the process is a fork of an interpreter
    that already imported the stack (tests/support/warm_cli.py); any other environment gets a fresh interpreter."""
    env = cli_env()
    if module in WARM_MODULES and warm_cli.usable(env):
        CLI_STARTS["warm"] += 1
        return warm_cli.run(module, args, cwd, env, timeout)
    CLI_STARTS["cold"] += 1
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def start_cli(args: list[str], cwd: Path, new_session: bool = False, log: Path | None = None, **env: str):
    """`python -m slime_hydra ARGS` in `cwd` started, not waited for: a Popen (stdout and stderr read as text by
    communicate), or the same surface over a fork of the warm interpreter where run_cli would fork. new_session: its own
    session and process group (start_new_session), for a test that signals the group. log: stdout and stderr both
    appended to that file instead of pipes (read the file, not communicate's result). env: added to cli_env()."""
    full = cli_env() | env
    if warm_cli.usable(full):
        CLI_STARTS["warm"] += 1
        return warm_cli.Process("slime_hydra", args, cwd, full, new_session=new_session, log=log)
    CLI_STARTS["cold"] += 1
    with open(log, "a") if log is not None else contextlib.nullcontext(subprocess.PIPE) as out:
        return subprocess.Popen([sys.executable, "-m", "slime_hydra", *args], cwd=cwd, env=full, stdout=out,
                                stderr=subprocess.STDOUT if log is not None else subprocess.PIPE, text=True,
                                start_new_session=new_session)


def problems_of(overrides: list[str], multirun: bool = False) -> list[str]:
    """Every problem validation reports for `overrides` (it must refuse them)."""
    from slime_hydra.app.preflight import preflight  # here: conftest imports this module, and the stack stays unimported

    with pytest.raises(ConfigError) as info:
        preflight(overrides, multirun=multirun)
    return info.value.problems


# Small, fast variant of the embedded default for end-to-end tests.
FAST = ["logger.progress_bar=false", "warmstart.steps=0", "rollout.rollout_batch_size=8", "rollout.n_samples_per_prompt=4",
        "train.micro_batch_size=16", "eval.eval_interval=null"]
