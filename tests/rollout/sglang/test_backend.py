"""rollout.backend=sglang against real SGLang servers on CPU (two engines) behind the real sglang-router.

One GRPO run of the embedded task is shared by the module (disaggregated: weights synced over a gloo
update group): it learns, every weight sync is checked equal on both engines
(`check_weight_update_equal`); afterwards the same engines serve an aborted rollout, and one engine is
killed mid-rollout (fault tolerance restarts it, resyncs it, and no sample is lost or duplicated).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time

import pytest

from slime_hydra.app.preflight import compose_run
from slime_hydra.errors import ConfigError
from slime_hydra.protocols import InProcessWeights
from slime_hydra.types import SamplingParams, Status
from tests.support.learning import report

pytestmark = [pytest.mark.sglang, pytest.mark.integration]

EXPERIMENT = "experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1"


def test_pass_through_keys_are_checked_without_importing_sglang():
    import sys

    with pytest.raises(ConfigError) as e:
        compose_run([EXPERIMENT, "+rollout.sglang.mem_fracton_static=0.3", "+rollout.sglang.tp_size=2",
                     "+rollout.sglang.random_seed=3", "+rollout.sglang_router.health_check_intervl_secs=3"])
    msg = str(e.value)
    assert "rollout.sglang.mem_fracton_static is not a field of sglang's ServerArgs; did you mean rollout.sglang.mem_fraction_static" in msg
    assert "rollout.sglang.tp_size is set by the runner" in msg and "cluster.rollout_num_gpus_per_engine" in msg
    assert "rollout.sglang.random_seed is set by the runner" in msg
    assert "rollout.sglang_router.health_check_intervl_secs" in msg and "health_check_interval_secs" in msg
    # the check parsed sglang's sources and imported nothing: asked in a fresh interpreter, since other
    # tests of this pytest process may have imported sglang already
    probe = ("import sys; from slime_hydra.app.preflight import compose_run\n"
             "try:\n    compose_run([%r, '+rollout.sglang.mem_fracton_static=0.3'])\n"
             "except Exception as e:\n    assert 'mem_fraction_static' in str(e), e\n"
             "print('sglang' in sys.modules)") % EXPERIMENT
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
    cfg = compose_run([EXPERIMENT, "+rollout.sglang.context_length=128"])
    assert cfg.rollout.sglang["context_length"] == 128 and cfg.rollout.sglang["device"] == "cpu"


def test_weight_sync_mode_is_checked_before_anything_starts():
    from slime_hydra.rollout.sglang.checks import weight_sync_mode

    assert weight_sync_mode("auto", colocate=True) == "tensor" and weight_sync_mode("auto", colocate=False) == "distributed"
    with pytest.raises(ConfigError) as e:
        compose_run([EXPERIMENT, "rollout.weight_sync=nccl"])
    assert "rollout.weight_sync='nccl' is not one of ['auto', 'tensor', 'distributed', 'disk']" in str(e.value)
    with pytest.raises(ConfigError, match=r"rollout.weight_sync=distributed needs rollout.sglang.dp_size=1 \(got 2\)"):
        compose_run([EXPERIMENT, "cluster.colocate=false", "+rollout.sglang.dp_size=2"])
    compose_run([EXPERIMENT, "cluster.colocate=false", "+rollout.sglang.dp_size=2", "rollout.weight_sync=disk"])


RUN = ["logger=none", "logger.progress_bar=false", "eval.eval_interval=null", "train.lr_decay_style=constant",
       "cluster.device=cpu",
       # a fixed warm start (the experiment's 280 steps now land at held-out 0.165, where 30 rollouts moved it only
       # +0.03 to +0.09, below the old bound of +0.1025); the SFT steps run on the trainer, so the start is deterministic:
       # 0.455 in every repetition below, through the engines as through the local backend
       "warmstart.steps=340"]
NUM_ROLLOUT = 50
# The learning bounds come from repetitions of this module's run (each its own process, fresh engines):
#   .venv/bin/python -m benchmarks.repeat_sglang_learning --reps N
# 7 repetitions at this config (2026-12-02, 2-core VM, 170-730 s each with other jobs beside them):
#   held-out rise (0.455 -> ...): +0.180 +0.150 +0.115 +0.085 +0.085 +0.135 +0.105; mean 0.122, sd 0.035
#   training reward, fitted rise over the 50 rollouts: +0.122 +0.156 +0.085 +0.113 +0.150 +0.141 +0.149; mean 0.131, sd 0.025
# Learning switched off (train.lr=1e-12; validation refuses 0): held-out +0.000 (the same weights, greedy: exactly
# the start), fitted reward rise -0.003 (its standard error from the residuals: 0.024).
# The bounds: the held-out accuracy must rise at all (> 0: a working build misses it with probability ~3e-4 at
# the measured sd, 0.7% at a pessimistic sd of 0.05, the binomial noise of a paired difference on 200 prompts;
# a frozen build fails it always) and the fitted reward rise must reach 0.03 (a working build: 4 sd below the
# mean; a build that does not learn passes it with probability ~8%, (0.03 + 0.003) / 0.024 = 1.4 sd).
# Before (30 rollouts from the experiment's 280-step warm start, held-out 0.165): +0.09 and +0.03 against a
# bound of +0.1025 set from a single run, and CI failed on it.
EVAL_RISE_MIN = 0.0  # strict: last > first
REWARD_RISE_MIN = 0.03


def fitted_rise(y: list[float]) -> float:
    """The least-squares line through y (one point per rollout), its rise from the first rollout to the last."""
    n = len(y)
    xm, ym = (n - 1) / 2, sum(y) / n
    slope = sum((x - xm) * (v - ym) for x, v in enumerate(y)) / sum((x - xm) ** 2 for x in range(n))
    return slope * (n - 1)


FIXTURE = ["cluster.colocate=false", "rollout.check_weight_update_equal=true", "rollout.rollout_health_check_interval=1",
           # (first wait: a relaunch took over 2 minutes to start on the loaded 2-core VM and was killed at 120 s)
           "rollout.rollout_health_check_first_wait=600", "rollout.sglang_router_policy=round_robin",
           "rollout.sglang.max_total_tokens=16384",  # the abort test's 64 x ~200 tokens fit in it
           # the router's own retries would re-send a dead engine's requests before the client sees
           # a failure; off, so the test counts the backend's re-dispatch
           "+rollout.sglang_router.disable_retries=true", "rollout.sglang_max_retries=12"]


def rewards_of(history) -> list[float]:
    return [m["rollout/reward_mean"] for _, m in history if "rollout/reward_mean" in m]


def eval_of(history) -> list[tuple[int, float]]:
    return [(step, m["eval/addition/accuracy"]) for step, m in history if "eval/addition/accuracy" in m]


@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory):
    """The experiment's SFT warm start, then NUM_ROLLOUT GRPO rollouts through two engines, disaggregated
    (cluster.colocate=false: weight_sync=auto syncs over a gloo update group per engine); every sync is
    checked equal on both engines. The sglang components stay up for the other tests."""
    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    out = tmp_path_factory.mktemp("sglang")
    cfg = compose_run([EXPERIMENT, *RUN, f"num_rollout={NUM_ROLLOUT}", *FIXTURE])
    c = build(cfg, str(out))
    try:
        history = loop.run(loop_settings(cfg), c, str(out / "ckpt"))
        (out / "curves.json").write_text(json.dumps({"reward": rewards_of(history), "eval": eval_of(history)}))
        yield cfg, c, history
    finally:
        c.rollout.shutdown()
        for e in c.rollout.group.engines:  # no orphans: every engine's process group is gone
            assert not e.process.alive()


def test_grpo_through_sglang_learns_like_local(sglang_run):
    from slime_hydra.engine.steps import evaluate
    from slime_hydra.rollout.local import LocalRollout

    cfg, c, history = sglang_run
    assert len(rewards_of(history)) == NUM_ROLLOUT
    (s0, first), (s1, last) = eval_of(history)
    assert (s0, s1) == (0, NUM_ROLLOUT)
    # the engines serve the trainer's weights: the local backend's greedy eval of the trained model gives
    # the accuracy the engines gave (float32 both sides; only kernels differ: a few ties at most)
    here, _ = evaluate(LocalRollout(c.trainer.model, c.tokenizer, seed=cfg.seed), c.eval_sets, NUM_ROLLOUT, None)
    assert abs(here["eval/addition/accuracy"] - last) <= 0.03, (here["eval/addition/accuracy"], last)
    report("sglang_grpo", eval_first=first, eval_last=last, eval_rise=last - first,
           reward_fitted_rise=fitted_rise(rewards_of(history)))
    # and GRPO through them learns: held-out accuracy and the training reward's fitted rise, each above a bound
    # set from the repetitions above (see there: how often a working build fails it, and a frozen one passes)
    assert last - first > EVAL_RISE_MIN, eval_of(history)
    assert fitted_rise(rewards_of(history)) >= REWARD_RISE_MIN, rewards_of(history)


@pytest.mark.slow
def test_local_reference_run(tmp_path):
    """The same config, seed and warm start through the local backend (one engine in the driver): it learns
    within the same bounds (a reference for what the sglang run should show)."""
    from slime_hydra.app.build import build
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    cfg = compose_run([EXPERIMENT, "rollout=local", "cluster.rollout_num_gpus=null", *RUN, f"num_rollout={NUM_ROLLOUT}"])
    history = loop.run(loop_settings(cfg), build(cfg, str(tmp_path)), str(tmp_path / "ckpt"))
    (s0, first), (s1, last) = eval_of(history)
    print(f"local backend: eval/addition/accuracy {first:.3f} -> {last:.3f}, "
          f"reward fitted rise {fitted_rise(rewards_of(history)):+.3f}")
    assert last - first > EVAL_RISE_MIN and fitted_rise(rewards_of(history)) >= REWARD_RISE_MIN


def test_weight_versions_advance_and_engines_equal_the_trainer(sglang_run):
    from slime_hydra.rollout.sglang import weights as W

    cfg, c, history = sglang_run
    r = c.rollout
    assert r.mode == "distributed" and set(r._groups) == {0, 1}  # auto, not colocated: one gloo group per engine
    # rollout k (1-based) is generated by the weights synced after rollout k-1 (version 0: before training)
    versions = [m["rollout/weight_version"] for step, m in history if "rollout/weight_version" in m]
    assert versions == [float(k) for k in range(NUM_ROLLOUT)]
    assert r.weight_version == NUM_ROLLOUT
    named = list(c.trainer.named_weights())
    for e in r.group.engines:  # every sync above was checked too (check_weight_update_equal=true)
        assert W.check_equal(e.endpoint, named, cfg.model.dtype, 60) == len(named)
    # the check can fail: perturb one tensor on engine 0 only (from tensors, the colocated path), then
    # put the trainer's weights back over the update groups, in buckets of ~one tensor
    e0 = r.group.engines[0]
    name, t = named[1]
    W.update_from_tensors(e0.endpoint, [(name, t + 1.0)], r.weight_version, 1, 1 << 20, cfg.model.dtype, 60)
    with pytest.raises(W.WeightSyncError, match=name):
        W.check_equal(e0.endpoint, named, cfg.model.dtype, 60)
    biggest = max(t.numel() * t.element_size() for _, t in named)
    assert len(list(W.buckets(named, biggest))) > 10  # 46 tensors of the tiny model
    r.cfg.update_weight_buffer_size, before = biggest, r.cfg.update_weight_buffer_size
    try:
        r.update_weights(InProcessWeights.of(named), version=r.weight_version)  # check_weight_update_equal: raises if any differs
    finally:
        r.cfg.update_weight_buffer_size = before
    assert W.check_equal(e0.endpoint, named, cfg.model.dtype, 60) == len(named)
    # the colocated path makes an engine equal too: every tensor from tensors onto engine 1
    e1 = r.group.engines[1]
    W.update_from_tensors(e1.endpoint, [(n, t + 0.5) for n, t in named], r.weight_version, 1, 1 << 20, cfg.model.dtype, 60)
    assert W.check_equal(e1.endpoint, [(n, t + 0.5) for n, t in named], cfg.model.dtype, 60) == len(named)
    r.update_weights(InProcessWeights.of(named), version=r.weight_version)


def test_abort_returns_partial_samples_and_engines_keep_serving(sglang_run):
    """abort() mid-generation: every sample comes back, those cut short marked ABORTED with the tokens
    and logprobs they had; then the same samples continue from their tokens to the end."""
    from slime_hydra.agent.hook import AgentRollout
    from slime_hydra.app.plugins import load_hook

    _, c, _ = sglang_run
    r = c.rollout
    agent = AgentRollout(r, c.tokenizer, None, 1, load_hook)  # the agent wrapper forwards abort() to the backend
    samples = [s for g in c.source.next_groups(8) for s in g]  # 8 x 8 = 64
    # no stop token: each sample would run its full 200 new tokens (the context is 256); 64 x 200 tokens
    # take ~7 s on two loaded CPU engines; the abort comes after 0.75 s (the requests reach the engines in
    # milliseconds: an abort before they arrive would not stop them)
    sp = SamplingParams(1.0, 1.0, -1, 200, ())
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("samples", asyncio.run(agent.generate(samples, sp))))
    worker.start()
    time.sleep(0.75)
    t0 = time.monotonic()
    agent.abort()
    worker.join(timeout=120)
    assert not worker.is_alive() and time.monotonic() - t0 < 10  # returned at once, not after 200 tokens
    got = out["samples"]
    assert len(got) == 64 and [s.index for s in got] == [s.index for s in samples]
    aborted = [s for s in got if s.status == Status.ABORTED]
    assert len(aborted) >= 32, [(s.status, s.response_length) for s in got]
    partial = [s for s in aborted if 0 < s.response_length < 200]
    assert partial, [(s.status, s.response_length) for s in got]
    for s in got:
        assert s.response_length == len(s.rollout_log_probs) == len(s.loss_mask)
        assert s.tokens == list(s.prompt_tokens) + s.response_tokens
    cut = {id(s): s.response_tokens for s in aborted}
    asyncio.run(r.generate(got, sp))  # the engines serve again; aborted samples continue from their tokens
    assert all(s.status == Status.TRUNCATED and s.response_length == 200 and len(s.rollout_log_probs) == 200 for s in got)
    assert all(s.response_tokens[: len(cut[id(s)])] == cut[id(s)] for s in aborted)


def test_killed_engine_mid_rollout_loses_and_duplicates_nothing(sglang_run):
    """Kill engine 0 while a 64-prompt rollout is in flight: the rollout completes with all 64 × 8
    samples, each exactly once; the monitor relaunches the engine and waits through its ~30 s start
    (health checks every 1 s, first wait 600 s: it is not killed again), resyncs it, then it serves."""
    cfg, c, _ = sglang_run
    r = c.rollout
    e0 = r.group.engines[0]
    groups = c.source.next_groups(64)
    samples = [s for g in groups for s in g]
    keys = [(s.group_index, s.index) for s in samples]
    retried_before = r.client.retried
    # 48 tokens each, no stop token: ~25k tokens, several seconds on the CPU engines, so the kill at 1 s lands
    # mid-rollout (with eos the trained model's 3-4-token answers were all back within 1 s)
    sp = SamplingParams(1.0, 1.0, -1, 48, ())
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("samples", asyncio.run(r.generate(samples, sp))))
    worker.start()
    time.sleep(1.0)
    killed_at = time.monotonic()
    e0.process.kill()
    worker.join(timeout=300)
    got = out["samples"]
    assert len(got) == 64 * 8 and len(set((s.group_index, s.index) for s in got)) == 64 * 8
    assert [(s.group_index, s.index) for s in got] == keys
    for g in {s.group_index for s in got}:
        assert sum(s.group_index == g for s in got) == 8
    assert all(s.status in (Status.COMPLETED, Status.TRUNCATED) and s.response_length == len(s.rollout_log_probs) >= 1
               for s in got)
    assert all(s.weight_version == r.weight_version for s in got)
    assert r.client.retried > retried_before  # requests in flight on the killed engine were sent again
    assert e0.healthy.wait(timeout=600), e0.process.log_tail()
    took = time.monotonic() - killed_at
    assert e0.restarts == 1 and e0.launches == 2, (e0.restarts, e0.launches)  # one relaunch, never killed while starting
    assert took > cfg.rollout.rollout_health_check_interval * cfg.rollout.rollout_health_check_max_failures * 5
    from slime_hydra.rollout.sglang import weights as W

    named = list(c.trainer.named_weights())
    assert W.check_equal(e0.endpoint, named, cfg.model.dtype, 60) == len(named)  # resynced before serving
    body = {"input_ids": [10, 11, 12], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True}
    import httpx

    meta = httpx.post(e0.url + "/generate", json=body, headers=e0.endpoint.headers, timeout=60).json()["meta_info"]
    assert meta["weight_version"] == str(r.weight_version)
