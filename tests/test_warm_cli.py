"""The tier's CLI runs fork from a warm interpreter (tests/support/warm_cli.py) only while the environment they get is
the one it imported under. Libraries the tests use in-process write into the test process's environment
(tests/support/runs.py lists what: `import ray` sets RAY_CLIENT_MODE=0, ray.init PYTHONBREAKPOINT, torch's inductor
TORCHINDUCTOR_CACHE_DIR, megatron-core NVTE_*, ...). Passed on, any of them sent every later CLI run of that xdist worker to a cold interpreter (about 6 CPU-seconds more
each) and gave the run values a user's shell does not have."""

from __future__ import annotations

import os

import pytest

from tests.support import warm_cli
from tests.support.runs import LIBRARY_SET_ENV, cli_env


@pytest.mark.parametrize("key", LIBRARY_SET_ENV)
def test_a_key_a_library_wrote_reaches_a_cli_run_as_the_session_began(key, monkeypatch):
    import ray  # noqa: F401  (sets RAY_CLIENT_MODE=0 in this process, for real)

    assert os.environ["RAY_CLIENT_MODE"] == "0"
    if key != "RAY_CLIENT_MODE":
        monkeypatch.setenv(key, f"{warm_cli.SESSION_ENV.get(key)}, as a library wrote it")
    monkeypatch.delenv("SLIME_HYDRA_TEST_COLD_CLI", raising=False)
    env = cli_env()
    # the session's start value, not the library's; so the key cannot be what keeps a run from forking (whatever else
    # the tests before this one wrote: the session's summary line counts the runs that started cold)
    assert env.get(key) == warm_cli.SESSION_ENV.get(key) != os.environ[key]

