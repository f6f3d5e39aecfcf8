"""rollout.rollout_external_engine_addrs (slime's --rollout-external-engine-addrs): a run attaches to SGLang engines it did
not start. Checked before anything starts (the addresses, the backend, the key); against a real engine already running
(the test process's shared CPU engine): the run starts no engine, refuses one whose key or options are not the run's,
resets whatever weights it holds to the model's as version 0 and checks them, trains through it, and leaves it running.
"""

from __future__ import annotations

import os

import httpx
import pytest
from safetensors.torch import load_file

from slime_hydra.app.preflight import compose_run
from slime_hydra.errors import ConfigError
from slime_hydra.rollout.sglang import weights as W
from slime_hydra.rollout.sglang.checks import parse_engine_addr
from slime_hydra.rollout.sglang.endpoint import KEY_ENV

EXPERIMENT = "experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1"
SHORT = ["logger=none", "logger.progress_bar=false", "eval.eval_interval=null", "eval.skip_eval_before_train=true",
         "cluster.device=cpu", "cluster.colocate=true", "warmstart.steps=0", "rollout.rollout_batch_size=8",
         "rollout.n_samples_per_prompt=4", "train.micro_batch_size=16", "rollout.use_fault_tolerance=false", "num_rollout=1"]
KEY = "rollout.rollout_external_engine_addrs"


def test_an_address_is_host_and_port_with_or_without_the_scheme():
    assert parse_engine_addr("127.0.0.1:30000") == ("127.0.0.1", 30000)
    assert parse_engine_addr("http://node-3:8000") == ("node-3", 8000)
    assert parse_engine_addr("http://node-3:8000/") == ("node-3", 8000)
    assert parse_engine_addr("[::1]:30000") == ("::1", 30000)
    for bad in ("127.0.0.1", "node-3:http", "https://node-3:8000", "http://node-3:8000/generate", ":8000", "h:99999"):
        assert parse_engine_addr(bad) is None, bad


def test_an_attached_engine_starts_nothing_and_keeps_its_address(tmp_path):
    from slime_hydra.rollout.sglang.engines import Engine, ExternalLauncher

    launcher = ExternalLauncher([("10.0.0.7", 30000), ("::1", 30001)])
    engines = [Engine(i, lambda host, port: ["never", "run"], tmp_path / f"engine_{i}.log", launcher) for i in range(2)]
    for e in engines:
        e.launch()
        e.process.stop()
        e.process.kill()
        e.launch()  # the health monitor's relaunch: the same engine, waited for
    assert [e.url for e in engines] == ["http://10.0.0.7:30000", "http://[::1]:30001"]
    assert [(e.process.pid, e.process.alive(), e.launches) for e in engines] == [(None, True, 2)] * 2
    assert not any(tmp_path.iterdir())  # no log: the engines' are where they were started


def test_the_addresses_the_backend_and_the_key_are_checked_before_anything_starts(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError) as e:
        compose_run([EXPERIMENT, "cluster.backend=ray",
                     f"{KEY}=['127.0.0.1:0x','127.0.0.1:30000','http://127.0.0.1:30000']"])
    msg = str(e.value)  # every problem at once
    assert f"{KEY}[0]='127.0.0.1:0x' is not an engine address: give \"host:port\" or \"http://host:port\"" in msg
    assert f"{KEY} names an engine twice" in msg
    assert f"{KEY} with cluster.backend=ray" in msg and "set cluster.backend=local" in msg
    assert f"the engines' API key is read from ${KEY_ENV}, which is not set" in msg
    with pytest.raises(ConfigError, match=rf"{KEY} names SGLang engines; rollout.backend=local starts none"):
        compose_run([EXPERIMENT, "rollout=local", "cluster.rollout_num_gpus=null", f"{KEY}=[127.0.0.1:30000]"])
    monkeypatch.setenv(KEY_ENV, "k")
    cfg = compose_run([EXPERIMENT, f"{KEY}=[127.0.0.1:30000,'http://127.0.0.1:30001']"])
    assert cfg.rollout.rollout_external_engine_addrs == ["127.0.0.1:30000", "http://127.0.0.1:30001"]


def model_info(endpoint) -> dict:
    r = httpx.get(endpoint.url + "/model_info", headers=endpoint.headers, timeout=60)
    assert r.status_code == 200, r.text[:200]
    return r.json()


@pytest.mark.sglang
@pytest.mark.integration
def test_a_run_resets_the_engines_weights_trains_through_them_and_leaves_them_running(external_engine, tmp_path):
    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    engine = external_engine.endpoint
    # what another run leaves behind: its own weights, its own version
    files = load_file(str(external_engine.model_dir / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    W.update_from_tensors(engine, [(name, files[name] + 1.0)], 7, 1, 1 << 20, "float32", 60)
    assert model_info(engine)["weight_version"] == "7"
    cfg = compose_run([EXPERIMENT, *SHORT, external_engine.override])
    c = build(cfg, str(tmp_path))
    try:
        # attached: nothing started but the run's router; the engine holds the run's model as version 0, checked
        e = c.rollout.group.engines[0]
        assert (e.url, e.process.pid, len(c.rollout.group.engines)) == (engine.url, None, 1)
        assert [f.name for f in (c.rollout.dir / "logs").glob("*.log")] == ["router.log"]
        assert model_info(engine)["weight_version"] == "0"
        named = list(c.trainer.named_weights())
        assert W.check_equal(engine, named, cfg.model.dtype, 60) == len(named) == 46
        history = loop.run(loop_settings(cfg), c, str(tmp_path / "ckpt"))
        assert [m["rollout/weight_version"] for _, m in history if "rollout/weight_version" in m] == [0.0]
        assert model_info(engine)["weight_version"] == "1"  # the sync after the train step
        assert W.check_equal(engine, list(c.trainer.named_weights()), cfg.model.dtype, 60) == 46
    finally:
        c.rollout.shutdown()
    # the run's router is gone; the engine is not the run's to stop
    assert os.path.exists(f"/proc/{external_engine.pid}") and model_info(engine)["weight_version"] == "1"


@pytest.mark.sglang
@pytest.mark.integration
def test_an_engine_with_another_key_or_other_options_is_refused_naming_each(external_engine, tmp_path, monkeypatch):
    from slime_hydra.app.build import build
    from slime_hydra.rollout.sglang.engines import EngineStartError

    engine = external_engine.endpoint
    before = model_info(engine)["weight_version"]
    with pytest.raises(EngineStartError) as e:
        build(compose_run([EXPERIMENT, *SHORT, external_engine.override, "rollout.sglang.max_total_tokens=1024",
                           "model.dtype=bfloat16"]), str(tmp_path / "options"))
    msg = str(e.value)
    assert f"rollout.sglang.max_total_tokens=1024, but the engine at {engine.url} runs with max_total_tokens=65536" in msg
    assert f"model.dtype='bfloat16', but the engine at {engine.url} runs with dtype='float32'" in msg
    assert "set each key to the engine's value" in msg
    monkeypatch.setenv(KEY_ENV, "not-the-engines-key")
    with pytest.raises(EngineStartError, match=rf"the engine at {engine.url} refused the key in \${KEY_ENV} \(HTTP 401\)"):
        build(compose_run([EXPERIMENT, *SHORT, external_engine.override]), str(tmp_path / "key"))
    assert model_info(engine)["weight_version"] == before  # neither run sent it anything


def wait_for(what: str, cond, timeout_s: float) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.sglang
@pytest.mark.integration
def test_an_engine_that_stops_answering_is_waited_for_and_resynced_never_restarted(external_engine, external_router,
                                                                                  tmp_path):
    """With use_fault_tolerance the health monitor sees the engine fail its checks (SIGSTOP: /health times out) and takes
    it out of service; its "restart" starts nothing. Once it answers again (SIGCONT) it gets the last synced weights
    and version before it serves: the same process, nothing else started. The router is not the run's either (the
    shared one): the engine stays registered with it throughout, and the router routes to it again."""
    import signal

    from slime_hydra.app.build import build

    engine = external_engine.endpoint
    cfg = compose_run([EXPERIMENT, *SHORT, external_engine.override, *external_router.overrides, "rollout.use_fault_tolerance=true",
                       "rollout.rollout_health_check_interval=1", "rollout.rollout_health_check_max_failures=1"])
    c = build(cfg, str(tmp_path))
    try:
        e = c.rollout.group.engines[0]
        named = list(c.trainer.named_weights())
        # what a resync must put back: another version of the weights, seen only by the rollout
        W.update_from_tensors(engine, [(n, t + 1.0) for n, t in named[:1]], 5, 1, 1 << 20, "float32", 60)
        os.kill(external_engine.pid, signal.SIGSTOP)
        try:
            wait_for("the engine taken out of service", lambda: not e.healthy.is_set(), 60)
        finally:
            os.kill(external_engine.pid, signal.SIGCONT)
        wait_for("the engine serving again", e.healthy.is_set, 120)
        assert (e.restarts, e.launches, e.process.pid) == (1, 2, None)
        assert model_info(engine)["weight_version"] == "0"  # the attach's version, re-sent
        assert W.check_equal(engine, named, cfg.model.dtype, 60) == len(named)
        assert not list((c.rollout.dir / "logs").glob("*.log"))  # nothing of the run's started
        router = external_router.endpoint
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}
        wait_for("the router routing to it again", lambda: httpx.post(router.url + "/generate", json=body,
                                                                       headers=router.headers, timeout=60).status_code == 200, 60)
    finally:
        c.rollout.shutdown()
    assert os.path.exists(f"/proc/{external_engine.pid}") and os.path.exists(f"/proc/{external_router.pid}")
