"""train.backend=megatron with rollout.backend=sglang under cluster.backend=ray: both halves as Ray actors on CPU.

2 megatron ranks (TP=2 over gloo; a second pair with DP=2, TP=1, drives the same engines) and 2 real SGLang CPU engines
behind the real sglang-router, on the session's `ray start --head` cluster (4 bundles when disaggregated, 2 more for
the DP=2 pair); their log-probs and first train step are the in-process megatron run's. The
ranks gather their TP shards to Hugging Face names and send them to the engines themselves, in buckets: engine e over a
gloo update group that rank e opens (disaggregated; a relaunched engine gets a new one), or as handles from the rank on
its bundle (colocated); the driver pauses, flushes and continues, and never fetches the weights. Every sync is checked equal
(`rollout.check_weight_update_equal=true`) and every sample carries the weight version that generated it. The ranks
run megatron on CPU under tests/support/megatron_cpu/shim.py, installed in every worker of the job by a
`worker_process_setup_hook` (tests/orchestration/test_megatron_group.py); the engine actors get it too, their servers do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from pathlib import Path

import pytest
import torch

from slime_hydra.app.preflight import compose_run
from slime_hydra.types import SamplingParams, Status
from tests.support.megatron_cpu import ray_ranks

pytestmark = [pytest.mark.sglang, pytest.mark.integration]

EXPERIMENT = "experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1"
# the two layouts of 2 ranks: TP=2 (DP=1), and TP=1 (DP=2: each rank trains its share of a step's samples)
TP2 = ["parallelism.tensor_model_parallel_size=2"]
DP2 = ["parallelism.tensor_model_parallel_size=1"]
RAY = ["cluster.backend=ray", "cluster.actor_num_gpus_per_node=2", "cluster.rollout_num_gpus=2"]
COMMON = [EXPERIMENT, "train=megatron", "logger=none", "logger.progress_bar=false", "train.lr_decay_style=constant",
          "cluster.device=cpu", "rollout.check_weight_update_equal=true", "rollout.use_fault_tolerance=true",
          "rollout.rollout_health_check_interval=1", "rollout.rollout_health_check_first_wait=600",
          "rollout.sglang.max_total_tokens=16384", "rollout.sglang_router_policy=round_robin",
          # while an engine restarts (minutes on a loaded CPU) its requests go to the other one, or wait it out
          "rollout.sglang_max_retries=60", "cluster.ray_call_timeout_s=1800"]


@pytest.fixture(scope="module")
def cluster(ray_head):
    """The session's `ray start --head` cluster, in this module's namespace: its placement groups take 8 of the logical
    CPUs (2 train + 2 rollout bundles of one CPU, + 2 for the DP=2 ranks, + 2 for the PPO ranks); every worker of this
    job installs the CPU shim first."""
    import ray

    ray_ranks.join_with_shim(ray_head, "megatron_sglang")
    yield ray_head.gcs_address
    ray.shutdown()


def built(tmp: Path, args: list[str]):
    from slime_hydra.app.build import build

    cfg = compose_run(args)
    return cfg, build(cfg, str(tmp))


def first_step(args: list[str], cfg, c) -> dict:
    """Before training: samples drawn from the engines (the initial weights); their log-probs from the Ray ranks, from
    the single-process megatron backend (TP=PP=DP=1, the same seed: the same initial weights) on the same batch, and the
    engines' own -> the largest differences over the response tokens. Then the first train step (train_rollout) of that
    batch on both -> "train": {metric: (Ray, single process)}. Its advantages are set, not scored (the untrained
    model's rewards tie, so GRPO's would all be 0 and nothing would train): -1, 0, 1 in turn, so 11 of the 32 samples
    are skipped (train.skip_zero_advantage_samples) and DP=2 splits the other 21 as 11 + 10. The Ray ranks are one step
    on when the loop starts from them."""
    from slime_hydra.app.algorithm import run_specs
    from slime_hydra.app.build import build_trainer
    from slime_hydra.models.build import build_model
    from slime_hydra.training.batch import collate

    c.rollout.update_weights(c.trainer.named_weights(), version=0)  # checked equal
    samples = [s for g in c.source.next_groups(4) for s in g]
    asyncio.run(c.rollout.generate(samples, SamplingParams(1.0, 1.0, -1, cfg.rollout.rollout_max_response_len, ())))
    batch = collate(samples, torch.tensor([float(i % 3 - 1) for i in range(len(samples))]), c.tokenizer.pad_token_id)
    ray_lp = c.trainer.compute_log_probs(batch)
    one = compose_run([a for a in args if a not in RAY and "tensor_model_parallel" not in a and "colocate" not in a])
    local = build_trainer(one, run_specs(one), build_model(one.model, c.tokenizer, one.seed), torch.device("cpu"))
    local_lp = local.compute_log_probs(batch)
    ray_m, local_m = c.trainer.train_rollout(batch), local.train_rollout(batch)
    m = batch.loss_mask.bool()
    return {"tokens": float(m.sum()), "ray_vs_local": float((ray_lp - local_lp)[m].abs().max()),
            "ray_vs_engine": float((ray_lp - batch.rollout_log_probs)[m].abs().max()),
            "engine_lp_mean": float(batch.rollout_log_probs[m].mean()),
            "train": {k: (ray_m[k], local_m.get(k)) for k in ray_m} | {k: (None, v) for k, v in local_m.items() if k not in ray_m}}


def step_and_two_rollouts(label: str, args: list[str], cfg, c, out: Path) -> tuple[dict, list]:
    """first_step, then the loop's rollouts (SHORT: 2) from the ranks it trained; the times printed."""
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    t0 = time.monotonic()
    step = first_step(args, cfg, c)
    t1 = time.monotonic()
    history = loop.run(loop_settings(cfg), c, str(out / "ckpt"))
    print(f"{label}: first step {t1 - t0:.0f} s, 2 rollouts {time.monotonic() - t1:.0f} s; {step}; "
          f"{[{k: v for k, v in m.items() if 'sync' in k or 'logprob' in k} for _, m in history]}")
    return step, history


@contextlib.contextmanager
def fetches_counted(trainer):
    """The train group's object-store route (rank 0's gathered weights to the driver), counted: one entry per call."""
    calls: list[int] = []
    fetch = trainer._in_object_store
    trainer._in_object_store = lambda: calls.append(1) or fetch()
    try:
        yield calls
    finally:
        trainer._in_object_store = fetch


def rank_update_groups(rank) -> dict[int, str]:
    """engine index -> the name of the update group this train rank actor opened for it (RankStage's own)."""
    import ray

    names = lambda self: {e: g.pg_name for e, g in (self._update_groups.groups if self._update_groups else {}).items()}  # noqa: E731
    return ray.get(rank.__ray_call__.remote(names), timeout=60)


def assert_ranks_fed_the_engines(c, fetched: list) -> None:
    """Over update groups opened by the ranks (engine e by rank e): the driver opened none, fetched nothing."""
    from slime_hydra.orchestration.rank_weights import RankWeights

    r = c.rollout
    assert r.mode == "distributed" and r._groups == {} and fetched == [], (r._groups, fetched)
    assert isinstance(r._last_weights, RankWeights) and r._last_weights.feeders == [[0, 1]]  # one pipeline stage
    for rank, e in ((0, 0), (1, 1)):
        assert list(rank_update_groups(c.trainer.ranks[rank])) == [e]


def assert_engines_hold_rank0s_weights(cfg, c) -> None:
    """Every engine equals rank 0's weights, iterated: TP-gathered Hugging Face tensors through the object store."""
    from slime_hydra.rollout.sglang import weights as W

    named = list(c.trainer.named_weights())
    for e in c.rollout.group.engines:
        assert W.check_equal(e.endpoint, named, cfg.model.dtype, 60) == len(named)


# float32, unit roundoff u = 2^-24 = 6e-8. The layouts add the same terms in other orders: TP=2 each row-parallel matmul's
# two halves (reductions of up to 384 terms), DP=2 a step's samples in two rank partials (metrics summed after, gradients
# all-reduced), the single process micro-batches of 16 + 5 samples. Reordering a sum of n terms moves it by at most
# (n - 1) u sum|terms| (2.3e-5 relative for n = 384), by about sqrt(n) u = 1.2e-6 as a random walk; the backward pass
# through 4 layers compounds a few such: rel 1e-5, between the two. Measured (2026-12-03): TP=2 grad_norm 7.4e-7
# relative (12 u), entropy 3e-8; DP=2 entropy 9e-8, grad_norm and log-probs bit-equal. A metric that averages
# |log-prob - engine's| (1.5e-7 itself) moves by at most the largest log-prob difference: that is its absolute bound.
STEP_REL = 1e-5


def assert_first_step_equal(step: dict) -> None:
    """The Ray ranks' first step is the single process's: the same metrics, each to float32 rounding."""
    train, atol = step["train"], max(1e-7, step["ray_vs_local"])
    assert {"train/loss", "train/pg_loss", "train/grad_norm", "train/entropy"} <= train.keys(), train
    for k, (ray_v, local_v) in train.items():
        assert ray_v is not None and local_v is not None, (k, train)
        assert ray_v == pytest.approx(local_v, rel=STEP_REL, abs=atol), (k, train)
    assert train["train/kept_samples"] == (21.0, 21.0) and train["train/grad_norm"][0] > 0, train


def rewards_of(history) -> list[float]:
    return [m["rollout/reward_mean"] for _, m in history if "rollout/reward_mean" in m]


def eval_of(history) -> list[tuple[int, float]]:
    return [(step, m["eval/addition/accuracy"]) for step, m in history if "eval/addition/accuracy" in m]


def versions_of(history) -> list[float]:
    return [m["rollout/weight_version"] for _, m in history if "rollout/weight_version" in m]


# The default tier (2026-12-03, this 2-core VM at load ~15, 553 s in all): the disaggregated fixture 185 s (the engines'
# start most of it), the DP=2 pair on its engines 95 s (its ranks' start 83), the kill 70 s, the colocated case 176 s
SHORT = ["warmstart.steps=0", "num_rollout=2", "eval.eval_interval=null", "rollout.rollout_batch_size=8", "train.micro_batch_size=16"]


# The tests that start their own components come first: the module's disaggregated components hold 4 CPUs of the
# cluster until the module ends.
@pytest.mark.slow  # the default tier's colocated case is test_multi_node.py's TP=2 over two nodes: the same checks, and placement
def test_colocated_syncs_from_tensors_every_update_equal(cluster, tmp_path):
    """cluster.colocate=true: each engine shares a train rank's bundle (2 bundles); weights go from tensors (shared-memory
    handles on CPU) in buckets, each engine's from the train rank on its bundle (orchestration/rank_weights.py: the rank
    serialises handles to its own tensors, nothing goes through the object store). 2 rollouts, every sync checked equal
    (on the rank, against its tensors; and once more here against rank 0's through the object store); log-probs as in
    the disaggregated case."""
    from slime_hydra.orchestration.rank_weights import RankWeights

    args = [*COMMON, *TP2, *RAY, "cluster.colocate=true", *SHORT]
    cfg, c = built(tmp_path, args)
    try:
        r = c.rollout
        assert r.mode == "tensor" and r.group.launcher.layout.num_bundles == 2
        assert sorted(b for bs in r.group.launcher.layout.engine_bundles for b in bs) == [0, 1]  # the train ranks' bundles
        lp, history = step_and_two_rollouts("colocated", args, cfg, c, tmp_path)
        assert lp["tokens"] > 0 and lp["ray_vs_local"] < 1e-4 and lp["ray_vs_engine"] < 1e-2, lp
        assert_first_step_equal(lp)
        assert versions_of(history) == [0.0, 1.0] and r.weight_version == 2 == r.synced_version
        assert isinstance(r._last_weights, RankWeights) and r._last_weights.engine_ranks == [[[0], [1]]]  # one pipeline stage
        assert_engines_hold_rank0s_weights(cfg, c)
    finally:
        c.rollout.shutdown()


# Learning: the warm start test_sglang.py uses (340 SFT steps, here on the megatron ranks), then GRPO rollouts of the
# experiment's size (32 prompts x 8) through the two engines, disaggregated; its bounds (EVAL_RISE_MIN, REWARD_RISE_MIN)
# One run (2026-12-03, this 2-core VM at load ~11, 551 s): held-out 0.650 -> 0.785, reward fitted rise +0.125 over the
# 30 rollouts (test_sglang.py's torch runs: +0.122 and +0.131 on average over 50)
# DP=2 (2026-12-03, 350 s at load ~9): held-out 0.625 -> 0.735, reward fitted rise +0.078 (0.527 first, 0.438 last,
# noisy); before sft_step split its rows over DP (each rank took all: twice the gradient) the warm start reached 0.315
LEARN_ROLLOUTS = 30


def learns(tmp_path: Path, layout: list[str]) -> None:
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop
    from tests.rollout.sglang.test_backend import EVAL_RISE_MIN, REWARD_RISE_MIN, fitted_rise

    args = [*COMMON, *layout, *RAY, "cluster.colocate=false", "warmstart.steps=340", f"num_rollout={LEARN_ROLLOUTS}",
            f"eval.eval_interval={LEARN_ROLLOUTS}"]
    t0 = time.monotonic()
    cfg, c = built(tmp_path, args)
    try:
        history = loop.run(loop_settings(cfg), c, str(tmp_path / "ckpt"))
    finally:
        c.rollout.shutdown()
    rewards, evals = rewards_of(history), eval_of(history)
    print(f"learning ({layout}): {time.monotonic() - t0:.0f} s; eval {evals}; reward fitted rise {fitted_rise(rewards):+.3f}; "
          f"rewards {[round(x, 3) for x in rewards]}")
    assert versions_of(history) == [float(k) for k in range(LEARN_ROLLOUTS)]  # every sync checked equal, or the run raised
    (s0, first), (s1, last) = evals
    assert (s0, s1) == (0, LEARN_ROLLOUTS)
    assert last - first > EVAL_RISE_MIN, evals
    assert fitted_rise(rewards) >= REWARD_RISE_MIN, rewards


@pytest.mark.slow
def test_disaggregated_grpo_learns(cluster, tmp_path):
    learns(tmp_path, TP2)


@pytest.mark.slow
def test_disaggregated_grpo_learns_data_parallel(cluster, tmp_path):
    """TP=1, so the 2 ranks are DP=2: each trains half of every step's samples."""
    learns(tmp_path, DP2)


@pytest.fixture(scope="module")
def disaggregated(cluster, tmp_path_factory):
    """2 rollouts, disaggregated (cluster.colocate=false: weights over one gloo update group per engine, opened
    by the rank that feeds it), after the first-step log-prob comparison; the object-store fetches during it counted. The
    components stay up for the kill test."""
    out = tmp_path_factory.mktemp("disaggregated")
    args = [*COMMON, *TP2, *RAY, "cluster.colocate=false", *SHORT]
    t0 = time.monotonic()
    cfg, c = built(out, args)
    print(f"disaggregated: build {time.monotonic() - t0:.0f} s")
    try:
        with fetches_counted(c.trainer) as fetched:
            lp, history = step_and_two_rollouts("disaggregated", args, cfg, c, out)
        yield cfg, c, history, lp, fetched
    finally:
        c.rollout.shutdown()


def test_disaggregated_syncs_every_update_equal_and_matches_one_process(disaggregated):
    from slime_hydra.orchestration.megatron_group import MegatronTrainGroup
    from slime_hydra.orchestration.sglang_engines import RayLauncher, RemoteServer

    cfg, c, history, lp, fetched = disaggregated
    r = c.rollout
    assert isinstance(c.trainer, MegatronTrainGroup) and isinstance(r.group.launcher, RayLauncher)
    assert_ranks_fed_the_engines(c, fetched)  # one gloo update group per engine, rank 0 -> engine 0, rank 1 -> engine 1
    assert all(isinstance(e.process, RemoteServer) and e.process.alive() for e in r.group.engines)
    # the ranks' TP=2 log-probs are the single process's (TP=1) to float32 rounding; the engines' (other kernels) close
    assert lp["tokens"] > 0 and lp["ray_vs_local"] < 1e-4, lp
    assert lp["ray_vs_engine"] < 1e-2, lp
    assert_first_step_equal(lp)  # and so is their first train step on those samples
    # rollout k is generated by the weights synced after rollout k-1; each sync was checked equal on both engines
    assert versions_of(history) == [0.0, 1.0] and r.weight_version == 2 == r.synced_version
    assert_engines_hold_rank0s_weights(cfg, c)


KILL_GROUPS = 64  # 16 x 8 samples of 48 tokens took 2 s: a server still draining at SIGTERM could finish them all


def test_killed_engine_actor_mid_rollout_loses_and_duplicates_nothing(disaggregated):
    """Kill engine 0's actor (its server dies with it) while 64 groups x 8 samples are in flight (enough that the rollout
    outlasts the server's exit by seconds even on an idle machine): every sample comes back once; the monitor starts a
    new actor on the same bundle, relaunches the server, resyncs it, and it serves."""
    import httpx
    import ray

    from slime_hydra.rollout.sglang import weights as W

    cfg, c, _, _, _ = disaggregated
    r = c.rollout
    e, launcher = r.group.engines[0], r.group.launcher
    before = rank_update_groups(c.trainer.ranks[0])[0]
    actor, actor_pid, server = launcher.actors[0], launcher.actor_pids[0], e.process.pid
    groups = c.source.next_groups(KILL_GROUPS)
    samples = [s for g in groups for s in g]
    sp = SamplingParams(1.0, 1.0, -1, 48, ())  # no stop token: long enough that the kill lands mid-rollout
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("samples", asyncio.run(r.generate(samples, sp))))
    t0 = time.monotonic()
    worker.start()
    time.sleep(1.0)
    ray.kill(actor)
    worker.join(timeout=1200)
    assert not worker.is_alive()
    got = out["samples"]
    n = cfg.rollout.n_samples_per_prompt
    assert len(got) == KILL_GROUPS * n and len({(s.group_index, s.index) for s in got}) == KILL_GROUPS * n  # none lost, none twice
    assert len({s.group_index for s in got}) == KILL_GROUPS
    assert all(s.status in (Status.COMPLETED, Status.TRUNCATED) and s.response_length >= 1 for s in got)
    assert e.healthy.wait(timeout=900), e.process.log_tail()
    print(f"engine actor killed: rollout back and engine 0 serving again after {time.monotonic() - t0:.0f} s, "
          f"{r.client.retried} requests re-sent")
    assert e.restarts == 1 and e.launches == 2
    assert launcher.actors[0] is not actor and launcher.actor_pids[0] != actor_pid and e.process.pid != server  # a new actor
    # resynced by rank 0 over a new group (the new server has none of the old one's state), before it served again
    after = rank_update_groups(c.trainer.ranks[0])[0]
    assert before.startswith("slime_hydra_engine0_launch1_") and after.startswith("slime_hydra_engine0_launch2_"), (before, after)
    named = list(c.trainer.named_weights())
    assert W.check_equal(e.endpoint, named, cfg.model.dtype, 60) == len(named)
    body = {"input_ids": [10, 11, 12], "sampling_params": {"max_new_tokens": 2}}
    assert httpx.post(e.url + "/generate", json=body, headers=e.endpoint.headers, timeout=60).json()["meta_info"]["weight_version"] == str(r.weight_version)


# Last: it syncs its own weights into the disaggregated fixture's engines (the kill test checks them against the TP=2 ranks')
@pytest.fixture(scope="module")
def data_parallel(cluster, disaggregated, tmp_path_factory):
    """2 more megatron ranks, TP=1 so DP=2, in a placement group of their own (2 of the cluster's 8 CPUs), driving the
    disaggregated fixture's engines (the engines started once for the module): the same first-step comparison, then
    the same 2 rollouts through the loop, every sync checked equal."""
    _, shared, _, _, _ = disaggregated
    out = tmp_path_factory.mktemp("data_parallel")
    # token_mean here (the experiment's sample_token_mean for TP=2): the denominator is the step's token count, which
    # neither DP rank sees alone
    args = [*COMMON, *DP2, "algorithm.loss_aggregation=token_mean", *RAY, "cluster.colocate=false", *SHORT]
    cfg = compose_run(args)
    t0 = time.monotonic()
    c, pg, trainer = ranks_on_the_shared_engines(cfg, shared, out)
    try:
        print(f"data parallel: ranks {time.monotonic() - t0:.0f} s")
        with fetches_counted(trainer) as fetched:
            step, history = step_and_two_rollouts("data parallel", args, cfg, c, out)
        yield cfg, c, history, step, fetched
    finally:
        stopped(trainer, pg)


def ranks_on_the_shared_engines(cfg, shared, out: Path):
    """2 megatron ranks for `cfg` in a placement group of their own (2 of the cluster's CPUs), driving the disaggregated
    fixture's engines (the engines started once for the module): (components, the placement group, the trainer)."""
    import dataclasses

    from ray.util.placement_group import remove_placement_group

    from slime_hydra.app.algorithm import advantage_spec, run_specs
    from slime_hydra.app.build_ray import build_train_group
    from slime_hydra.app.plugins import reward_scorer
    from slime_hydra.engine.components import LoopState
    from slime_hydra.orchestration.calls import RayCalls
    from slime_hydra.orchestration.placement import create_placement_group

    # the train bundles only: the engines are the shared ones
    pg, layout = create_placement_group(dataclasses.replace(cfg.cluster, rollout_num_gpus=0), "the module's cluster")
    # the engines the ranks feed are the shared ones (bundles of the module's other group: none of these ranks' own)
    layout = dataclasses.replace(layout, engine_bundles=shared.rollout.group.launcher.layout.engine_bundles)
    trainer = None
    try:
        trainer = build_train_group(cfg, run_specs(cfg), cfg.model, pg, layout, RayCalls(cfg.cluster.ray_call_timeout_s),
                                    None, None)
    finally:
        if trainer is None:
            remove_placement_group(pg)
    # a fresh buffer on the same source; this run's reward and advantage estimator
    c = dataclasses.replace(shared, trainer=trainer, state=LoopState(), buffer=None, scorer=reward_scorer(cfg.reward),
                            advantage=advantage_spec(cfg.algorithm), output_dir=str(out))
    return c, pg, trainer


def stopped(trainer, pg) -> None:
    from ray.util.placement_group import remove_placement_group

    trainer.shutdown()
    remove_placement_group(pg)


def test_data_parallel_syncs_every_update_equal_and_matches_one_process(data_parallel):
    """DP=2: each rank trains its share of a step's samples (11 and 10 of the 21 kept), and the step is the single
    process's all the same: the loss and metrics are shares of the whole step's denominators (token_mean: the step's
    response tokens, of which each rank holds part), the gradients summed, not averaged, over the ranks."""
    from slime_hydra.orchestration.megatron_group import MegatronTrainGroup

    cfg, c, history, step, fetched = data_parallel
    r = c.rollout
    assert isinstance(c.trainer, MegatronTrainGroup) and cfg.parallelism.tensor_model_parallel_size == 1
    assert_ranks_fed_the_engines(c, fetched)  # these ranks' own groups, engine 0's for its second launch
    assert step["tokens"] > 0 and step["ray_vs_local"] < 1e-4 and step["ray_vs_engine"] < 1e-2, step
    assert_first_step_equal(step)
    assert versions_of(history) == [0.0, 1.0] and r.weight_version == 2 == r.synced_version
    assert_engines_hold_rank0s_weights(cfg, c)  # rank 0's weights: DP replicas, the whole model


def test_ppo_async_megatron_critic_over_the_shared_engines(disaggregated, tmp_path):
    """algorithm=ppo with train_mode=async: 2 megatron ranks (TP=2) hold the policy and the critic (its value head
    replicated over TP, training/megatron/critic.py), the shared engines generate one rollout ahead, 2 rollouts. The
    critic starts at values 0 (a zero head) and learns from rewards that differ within a group (the digit reward); the
    ranks feed the engines over their own update groups, every sync checked equal. Runs last: it syncs its weights into
    the shared engines."""
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    _, shared, _, _, _ = disaggregated
    args = [*COMMON, *TP2, "algorithm=ppo", "train_mode=async", "+reward.custom_rm._target_=tests.support.plugins.digit_reward",
            *RAY, "cluster.colocate=false", *SHORT]
    cfg = compose_run(args)
    t0 = time.monotonic()
    c, pg, trainer = ranks_on_the_shared_engines(cfg, shared, tmp_path)
    try:
        with fetches_counted(trainer) as fetched:
            history = loop.run(loop_settings(cfg), c, str(tmp_path / "ckpt"))
        print(f"ppo async: {time.monotonic() - t0:.0f} s; "
              f"{[{k: v for k, v in m.items() if k.startswith('train/value') or 'version' in k} for _, m in history]}")
        assert_ranks_fed_the_engines(c, fetched)
    finally:
        stopped(trainer, pg)
    steps = [m for s, m in history if s > 0 and "train/value_loss" in m]
    assert len(steps) == 2, history
    assert steps[0]["train/values_mean"] == 0.0  # the zero-initialised head: V = 0 before the critic's first step
    assert steps[0]["train/value_loss"] > 0 and steps[0]["train/value_grad_norm"] > 0  # returns differ from 0
    assert all(math.isfinite(m[k]) for m in steps for k in m if k.startswith("train/"))
    r = c.rollout
    assert r.weight_version == r.synced_version >= 1  # every sync checked equal on both engines, or the run raised
