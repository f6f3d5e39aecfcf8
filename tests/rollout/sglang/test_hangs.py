"""A weight-sync request and a generate request that never get an answer (an engine that hangs): a real HTTP
server on loopback accepts them and stays silent; each wait ends at its key's deadline with a RunError (exit 3)
naming the request and the key, not a bare httpx traceback and not a hang."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import torch

from slime_hydra.errors import RunError
from slime_hydra.rollout.sglang import weights as W
from slime_hydra.rollout.sglang.client import RouterClient, SGLangRequestError
from slime_hydra.rollout.sglang.endpoint import Endpoint
from slime_hydra.types import SamplingParams
from tests.support.silent_server import silent_on_post

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`


@pytest.fixture
def silent_server():
    """Reads each request, then answers nothing until the test ends."""
    with silent_on_post(answer_get=False) as url:
        yield url


def test_a_weight_sync_request_that_hangs_fails_at_its_deadline_naming_the_key(silent_server):
    named = [("model.norm.weight", torch.ones(8)), ("lm_head.weight", torch.ones(4, 8))]
    t0 = time.monotonic()
    with pytest.raises(W.WeightSyncError) as e:
        W.update_from_tensors(Endpoint(silent_server, "k"), named, version=1, tp_size=1, buffer_bytes=1 << 20, dtype="float32", timeout=1.0)
    took = time.monotonic() - t0
    assert 0.9 < took < 10, took  # the first request (the session probe) waited its 1 s, no fixed 60 s
    msg = str(e.value)
    assert f"POST {silent_server}/begin_weight_update: no answer within 1 s" in msg
    assert "rollout.sglang_request_timeout_s" in msg and "resume from the last checkpoint" in msg
    assert isinstance(e.value, RunError)  # the CLI prints it without a traceback and exits 3


def test_a_generate_request_that_hangs_is_retried_then_fails_naming_the_keys(silent_server):
    client = RouterClient(Endpoint(silent_server, "k"), concurrency=4, timeout_s=0.5, max_retries=1, backoff_s=0.1)
    sp = SamplingParams(max_new_tokens=4)

    async def go():
        async with httpx.AsyncClient() as http:
            return await client.generate(http, asyncio.Semaphore(4), [[1, 2, 3]], sp, 4, None, lambda: False)

    t0 = time.monotonic()
    with pytest.raises(SGLangRequestError) as e:
        asyncio.run(go())
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert f"POST {silent_server}/generate failed after 2 attempt(s): ReadTimeout" in msg
    assert "rollout.sglang_max_retries or rollout.sglang_request_timeout_s" in msg
    assert client.retried == 1 and isinstance(e.value, RunError)


def test_an_engine_that_does_not_start_in_time_fails_naming_the_key_and_leaves_no_process(tmp_path):
    """A real SGLang server on CPU needs tens of seconds to load; with a 2 s start deadline the run ends with
    exit 3 (a RunError, no traceback) naming the engine, the key to raise and the engine's log, and the server
    process it started is gone (it would hold a GPU otherwise)."""
    import subprocess

    from tests.support.runs import run_cli

    out = tmp_path / "run"
    r = run_cli(["experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1", "logger=none", "logger.progress_bar=false",
                 "warmstart.steps=0", "eval=none", "num_rollout=1", "rollout.sglang_server_start_timeout_s=2",
                 f"output_dir={out}"], tmp_path, timeout=300)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "did not answer" in r.stderr and "within 2 s" in r.stderr, r.stderr[-3000:]
    assert "rollout.sglang_server_start_timeout_s" in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert str(out / "sglang" / "logs") in r.stderr  # where to look
    left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert left == [], f"processes still running for {out}: {left}"


@pytest.fixture
def engine_that_does_not_generate():
    """Up (every GET answers 200 with `{}`) but silent on /generate."""
    with silent_on_post(answer_get=True) as url:
        yield url


def test_a_router_that_does_not_route_fails_at_the_start_deadline_naming_the_key(engine_that_does_not_generate, tmp_path):
    """The real sglang-router in front of an engine that is healthy but never generates: the first routed request
    waits rollout.sglang_server_start_timeout_s (here 8 s, not a fixed 60 s, not httpx's 30 s per request) and
    ends in a RunError naming the key and the router's log."""
    import sys

    from slime_hydra.rollout.sglang.engines import EngineStartError, wait_healthy, wait_routed
    from slime_hydra.rollout.sglang.process import ManagedProcess, free_port

    port = free_port(set())
    log = tmp_path / "router.log"
    router = ManagedProcess("sglang-router", [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls",
                                              engine_that_does_not_generate, "--host", "127.0.0.1", "--port", str(port),
                                              "--prometheus-port", str(free_port({port})), "--prometheus-host", "127.0.0.1"],
                            log).start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(router, url, 120, "sglang-router")
        t0 = time.monotonic()
        with pytest.raises(EngineStartError) as e:
            wait_routed(Endpoint(url, "k"), {"input_ids": [0], "sampling_params": {"max_new_tokens": 1}}, 8, f"log {log}")
        took = time.monotonic() - t0
    finally:
        router.stop()
    assert 7.5 < took < 20, took
    msg = str(e.value)
    assert f"sglang-router at {url} did not route its first request within 8 s" in msg, msg
    assert "rollout.sglang_server_start_timeout_s" in msg and str(log) in msg, msg
    assert isinstance(e.value, RunError)  # the CLI prints it without a traceback and exits 3


IGNORES_SIGTERM = ("import signal, subprocess, sys, time\n"
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(\"child up %d\" % 7, flush=True); time.sleep(600)'])\n"
                   "time.sleep(600)\n")


def test_stopping_a_server_that_ignores_sigterm_kills_its_whole_group_after_the_grace(tmp_path):
    """What a wedged SGLang server looks like to shutdown: it and its child (a scheduler) ignore SIGTERM. stop()
    waits the grace, then SIGKILLs the process group: both are gone, within grace + 5 s, never an endless wait."""
    import os
    import sys

    from slime_hydra.rollout.sglang.process import ManagedProcess

    log = tmp_path / "server.log"
    proc = ManagedProcess("stubborn server", [sys.executable, "-c", IGNORES_SIGTERM], log).start()
    deadline = time.monotonic() + 60
    while "child up 7" not in log.read_text():  # (the start line echoes the argv: "child up %d")
        assert time.monotonic() < deadline and proc.alive(), log.read_text()
        time.sleep(0.1)
    pgid = proc.pid
    t0 = time.monotonic()
    proc.stop(grace_s=1.0)
    took = time.monotonic() - t0
    assert not proc.alive() and proc.returncode == -9  # SIGTERM was ignored: it took the SIGKILL
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # nothing of the group is left, the child included
    assert 0.9 < took < 8, took
