"""Shared fixtures: an isolated working directory for every test, and the session's real servers (started once per
session, shared by the xdist workers, stopped at the end). Plain helpers (the CLI, MLflow stores, the tiny model and
batch) live in tests/support/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.*` importable from conftest however pytest was started
    sys.path.insert(0, str(ROOT))
from tests.support import servers  # noqa: E402
from tests.support.servers import mlflow_server, ray_head  # noqa: E402,F401  (session fixtures: real servers on loopback)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):  # the xdist controller, or a run without xdist: after every worker
        servers.stop_shared(session.config)
