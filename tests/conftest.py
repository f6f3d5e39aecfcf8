"""Shared fixtures: an isolated working directory and environment for every test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.*` importable from conftest however pytest was started
    sys.path.insert(0, str(ROOT))
from tests.servers import mlflow_server, ray_head  # noqa: E402,F401  (session fixtures: real servers on loopback)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


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


def run_cli(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m slime_hydra ARGS` in `cwd`, as a user would run it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "slime_hydra", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


# Small, fast variant of the embedded default for end-to-end tests.
FAST = ["logger.progress_bar=false", "warmstart.steps=0", "rollout.rollout_batch_size=8", "rollout.n_samples_per_prompt=4",
        "train.micro_batch_size=16", "eval.eval_interval=null"]
