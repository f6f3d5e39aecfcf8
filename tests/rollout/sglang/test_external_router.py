"""rollout.sglang_router_ip / rollout.sglang_router_port (slime's --sglang-router-ip / --sglang-router-port): a run
attaches to an sglang-router it did not start. Checked before anything starts (both keys, the backend, the router's
own options, the key); against a real router already running (the test process's shared one, in front of nothing):
the run registers its engine with the engine's key (the router's key is another), generates through it, refuses a
router that routes to anything it does not own, replaces its own engine's stale registration, and removes what it
registered when it ends, leaving the router running.
"""

from __future__ import annotations

import os

import httpx
import pytest

from slime_hydra.app.plan import plan_text
from slime_hydra.app.preflight import compose_run
from slime_hydra.errors import ConfigError
from slime_hydra.rollout.sglang.endpoint import ROUTER_KEY_ENV, Endpoint
from tests.support.silent_server import silent_on_post

EXPERIMENT = "experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1"
SHORT = ["logger=none", "logger.progress_bar=false", "eval.eval_interval=null", "eval.skip_eval_before_train=true",
         "cluster.device=cpu", "cluster.colocate=true", "warmstart.steps=0", "rollout.rollout_batch_size=8",
         "rollout.n_samples_per_prompt=4", "train.micro_batch_size=16", "rollout.use_fault_tolerance=false", "num_rollout=1"]
BODY = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}


def test_the_router_address_its_options_and_key_are_checked_before_anything_starts(monkeypatch):
    monkeypatch.delenv(ROUTER_KEY_ENV, raising=False)
    with pytest.raises(ConfigError) as e:
        compose_run([EXPERIMENT, "rollout.sglang_router_ip=127.0.0.1"])
    assert ("rollout.sglang_router_ip is set but rollout.sglang_router_port is not: a router already running is named "
            "by both") in str(e.value)
    with pytest.raises(ConfigError) as e:
        compose_run([EXPERIMENT, "rollout.sglang_router_ip='http://127.0.0.1'", "rollout.sglang_router_port=70000",
                     "rollout.sglang_router_policy=round_robin", "+rollout.sglang_router.balance_abs_threshold=8"])
    msg = str(e.value)  # every problem at once
    assert "rollout.sglang_router_ip='http://127.0.0.1' is not a host: give an IP or a host name" in msg
    assert "rollout.sglang_router_port=70000 is not a port: give a number in 1..65535" in msg
    assert "rollout.sglang_router={'balance_abs_threshold': 8} configures a router this run starts" in msg
    assert "rollout.sglang_router_policy=round_robin picks the policy of a router this run starts" in msg
    assert f"the router's API key is read from ${ROUTER_KEY_ENV}, which is not set" in msg
    with pytest.raises(ConfigError, match="names an sglang-router; rollout.backend=local routes nothing"):
        compose_run([EXPERIMENT, "rollout=local", "cluster.rollout_num_gpus=null", "rollout.sglang_router_ip=127.0.0.1",
                     "rollout.sglang_router_port=30000"])
    monkeypatch.setenv(ROUTER_KEY_ENV, "k")
    at = ["rollout.sglang_router_ip=127.0.0.1", "rollout.sglang_router_port=30000"]
    cfg = compose_run([EXPERIMENT, *at])
    assert (cfg.rollout.sglang_router_ip, cfg.rollout.sglang_router_port) == ("127.0.0.1", 30000)
    # the plan says so, for engines the run starts here or under Ray
    said = "registered with the sglang-router already running at 127.0.0.1:30000 (rollout.sglang_router_ip/port"
    assert said in plan_text([EXPERIMENT, *at]) and said in plan_text([EXPERIMENT, *at, "cluster.backend=ray"])
    assert "behind sglang-router (policy cache_aware)" in plan_text([EXPERIMENT])


def listed(router: Endpoint) -> dict[str, dict]:
    r = httpx.get(router.url + "/workers", headers=router.headers, timeout=30)
    assert r.status_code == 200, r.text[:200]
    return {w["url"]: w for w in r.json()["workers"]}


@pytest.mark.sglang
@pytest.mark.integration
def test_a_run_registers_its_engine_with_the_router_and_removes_it_at_the_end(external_engine, external_router, tmp_path):
    """The router and the engine have different keys: the run registers the engine with its own, so the router's
    requests reach it (an engine registered without its key answers the router 401)."""
    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    router, engine = external_router.endpoint, external_engine.endpoint
    assert router.key != engine.key and listed(router) == {}
    cfg = compose_run([EXPERIMENT, *SHORT, external_engine.override, *external_router.overrides])
    c = build(cfg, str(tmp_path))
    try:
        group = c.rollout.group
        assert (group.router, group.router_url) == (None, router.url)  # none started
        assert list(listed(router)) == [engine.url] and listed(router)[engine.url]["is_healthy"]
        assert not list((c.rollout.dir / "logs").glob("*.log"))  # no process of the run's: no log of its own
        assert httpx.post(router.url + "/generate", json=BODY, headers=engine.headers, timeout=60).status_code == 401
        history = loop.run(loop_settings(cfg), c, str(tmp_path / "ckpt"))
        assert [m["rollout/weight_version"] for _, m in history if "rollout/weight_version" in m] == [0.0]
    finally:
        c.rollout.shutdown()
    assert listed(router) == {}  # removed; the router keeps running
    assert os.path.exists(f"/proc/{external_router.pid}")
    assert httpx.get(router.url + "/health", timeout=30).status_code == 200
    written = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert written and not [f for f in written if router.key.encode() in f.read_bytes()]  # the keys reach no file
    assert not [f for f in written if engine.key.encode() in f.read_bytes()]


@pytest.fixture
def foreign_worker():
    """What the router takes for another run's engine: /health answers."""
    with silent_on_post(answer_get=True) as url:
        yield url


def register(router: Endpoint, url: str, key: str) -> str:
    r = httpx.post(router.url + "/workers", json={"url": url, "api_key": key}, headers=router.headers, timeout=30)
    assert r.status_code == 202, r.text[:200]
    return r.json()["worker_id"]


def wait_listed(router: Endpoint, urls: set[str], timeout_s: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while set(listed(router)) != urls:
        assert time.monotonic() < deadline, f"the router lists {set(listed(router))}, not {urls}, after {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.sglang
@pytest.mark.integration
def test_a_router_that_routes_elsewhere_is_refused_and_a_stale_registration_is_replaced(
        external_engine, external_router, foreign_worker):
    """Another run's worker on the router would take part of this run's rollouts: refused, naming it, nothing
    registered. The run's own engine URL registered earlier with a key that is not the engine's (a killed run's) is
    removed and registered again with the engine's key: the router then generates through it."""
    from slime_hydra.rollout.sglang.external_router import ExternalRouter, RouterAttachError

    router, engine = external_router.endpoint, external_engine.endpoint
    foreign_id = register(router, foreign_worker, "theirs")
    wait_listed(router, {foreign_worker})
    try:
        with pytest.raises(RouterAttachError) as e:
            ExternalRouter(router, 30).register([engine])
        msg = str(e.value)
        assert f"the sglang-router at {router.url} also routes to ['{foreign_worker}'], which this run did not start" in msg
        assert "DELETE /workers/{id}" in msg and "rollout.sglang_router_ip" in msg
        assert set(listed(router)) == {foreign_worker}  # left as it was
    finally:
        httpx.delete(f"{router.url}/workers/{foreign_id}", headers=router.headers, timeout=30)
    wait_listed(router, set())

    register(router, engine.url, "a-killed-runs-key")
    wait_listed(router, {engine.url})
    assert httpx.post(router.url + "/generate", json=BODY, headers=router.headers, timeout=60).status_code == 401
    attached = ExternalRouter(router, 30)
    attached.register([engine])
    try:
        assert list(listed(router)) == [engine.url]
        assert httpx.post(router.url + "/generate", json=BODY, headers=router.headers, timeout=60).status_code == 200
    finally:
        attached.remove()
    assert listed(router) == {}


@pytest.mark.sglang
@pytest.mark.integration
def test_a_router_that_refuses_the_key_or_does_not_answer_is_an_error_naming_the_fix(external_router, external_engine):
    from slime_hydra.rollout.sglang.external_router import ExternalRouter, RouterAttachError
    from slime_hydra.rollout.sglang.process import free_port

    router = external_router.endpoint
    with pytest.raises(RouterAttachError, match=rf"the sglang-router at {router.url} refused the key in "
                                                rf"\${ROUTER_KEY_ENV} \(HTTP 401\): export the key the router was started"):
        ExternalRouter(Endpoint(router.url, "not-the-routers-key"), 30).register([external_engine.endpoint])
    nobody = f"http://127.0.0.1:{free_port(set())}"
    with pytest.raises(RouterAttachError, match=rf"no sglang-router answered GET {nobody}/workers .*check "
                                                r"rollout.sglang_router_ip / rollout.sglang_router_port"):
        ExternalRouter(Endpoint(nobody, "k"), 30).register([external_engine.endpoint])
    assert listed(router) == {}
