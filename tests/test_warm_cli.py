"""The tier's CLI runs fork from a warm interpreter (tests/support/warm_cli.py) only while the environment they get is
the one it imported under. Libraries the tests use in-process write into the test process's environment: `import ray`
sets RAY_CLIENT_MODE=0, ray.init PYTHONBREAKPOINT (ray/_private/worker.py), torch's inductor TORCHINDUCTOR_CACHE_DIR
(torch/_inductor/runtime/cache_dir_utils.py), MLflow _MLFLOW_TELEMETRY_SESSION_ID (mlflow/telemetry/client.py).
Passed on, any of them sent every later CLI run of that xdist worker to a cold interpreter (about 6 CPU-seconds more
each) and gave the run values a user's shell does not have."""

from __future__ import annotations

import os

import pytest

from tests.support import warm_cli
from tests.support.runs import LIBRARY_SET_ENV, cli_env

SET_BY = {"PYTHONBREAKPOINT": "ray.util.rpdb._driver_set_trace", "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_user",
          "_MLFLOW_TELEMETRY_SESSION_ID": "99d238cdacd244c6b32121e2d3bfc1ab"}


@pytest.mark.parametrize("key", LIBRARY_SET_ENV)
def test_a_cli_run_after_a_library_wrote_the_environment_still_forks_warm(key, monkeypatch):
    import ray  # noqa: F401  (sets RAY_CLIENT_MODE=0 in this process, for real)

    assert os.environ["RAY_CLIENT_MODE"] == "0"
    if key != "RAY_CLIENT_MODE":
        monkeypatch.setenv(key, SET_BY[key])  # the value the library writes
    monkeypatch.delenv("SLIME_HYDRA_TEST_COLD_CLI", raising=False)
    env = cli_env()
    assert warm_cli.usable(env), {k for k in env.keys() ^ warm_cli.SESSION_ENV.keys()}
    assert env.get(key) == warm_cli.SESSION_ENV.get(key) != os.environ[key]  # the session's start value, not the library's

