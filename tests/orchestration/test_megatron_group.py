"""train.backend=megatron under cluster.backend=ray: 2 megatron ranks as Ray actors (TP=2, PP=2 or DP=2 over gloo, on the
session's real `ray start --head` cluster) run the engine loop as the single-process megatron run does.

The ranks run megatron on CPU under tests/support/megatron_cpu/shim.py: this module joins the cluster with a job
`runtime_env` whose `worker_process_setup_hook` installs the shim in every worker process of the job (the ranks, the
rollout manager and its engine: tests/support/megatron_cpu/ray_ranks.py), so nothing of the shim reaches production
code. The test process installs it too, for the single-process run it compares against.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_hydra.app.preflight import compose_run
from tests.support.megatron_cpu import ray_ranks, shim
from tests.support.runs import FAST

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`

LAYOUTS = {  # tests/support/megatron_cpu/workers.py's LAYOUTS as overrides: 2 ranks, what is not TP or PP is DP
    "tp2": ["parallelism.tensor_model_parallel_size=2"],
    "pp2": ["parallelism.pipeline_model_parallel_size=2"],
    "dp2": ["parallelism.use_distributed_optimizer=true"],
}
# 4 prompts × 4 samples = 16 = train.global_batch_size, one optimizer step per rollout, micro-batches of 8: the local run
# and TP/PP (DP=1) run 2 micro-batches a step, each DP=2 rank 1; one engine (cluster.rollout_num_gpus=1, colocated on
# bundle 0) samples what the in-process rollout samples
COMMON = FAST + ["train=megatron", "logger=none", "seed=5", "num_rollout=2", "save_interval=1", "rollout.rollout_batch_size=4",
                 "train.micro_batch_size=8", "eval.skip_eval_before_train=true"]
RAY = ["cluster.backend=ray", "cluster.actor_num_gpus_per_node=2", "cluster.colocate=true", "cluster.rollout_num_gpus=1"]


@pytest.fixture(scope="module")
def ray_cluster(ray_head):
    """This process joins the session's cluster; every worker process of this job installs the CPU shim first."""
    import ray

    ray_ranks.join_with_shim(ray_head, "megatron_group")
    yield ray_head.gcs_address
    ray.shutdown()


def run(tmp: Path, name: str, args: list[str]) -> list[tuple[int, dict[str, float]]]:
    """run_session as the CLI calls it; the history (step, metrics) of every rollout, from the last checkpoint."""
    from slime_hydra.app.session import run_session
    from slime_hydra.engine.checkpoint import load_state

    run_session(compose_run(args), str(tmp / name), args)
    return load_state(tmp / name / "checkpoints" / "rollout_000001")["history"]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The single-process megatron run (TP=PP=DP=1) of a train_mode (+ extra overrides), run once when a test first asks."""
    shim.install()
    tmp, runs = tmp_path_factory.mktemp("local"), {}

    def get(mode: str, extra: list[str] = ()):
        key = " ".join([mode, *extra])
        if key not in runs:
            runs[key] = run(tmp, f"{mode}{len(runs)}", COMMON + [f"train_mode={mode}", *extra])
        return runs[key]
    return get


def _train(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("train/")}


def assert_same_run(got, want, what: str) -> None:
    """Same rollouts (samples drawn from weights equal to float rounding), train/* equal to float32 rounding."""
    assert [s for s, _ in got] == [s for s, _ in want] == [1, 2], what
    for (step, g), (_, w) in zip(got, want):
        for k in ("rollout/reward_mean", "rollout/response_len_mean"):
            assert g[k] == w[k], (what, step, k)
        assert _train(g).keys() == _train(w).keys() and _train(g), (what, step)
        for k, v in _train(w).items():  # other summation orders over TP shards / DP ranks / stages: float32 rounding
            assert g[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (what, step, k)


SLOW = pytest.mark.slow  # 150-370 s each on this shared 2-core VM (2-rollout run + 1-rollout resume; + 75 s per local run)


# PP=2 in the default tier: it crosses every collective the group adds (last-stage metrics, every stage's weights
# gathered for the engines, one HF file per stage); TP=2, DP=2 and async in the slow tier
@pytest.mark.parametrize("layout,mode", [pytest.param("tp2", "sync", marks=SLOW), ("pp2", "sync"),
                                         pytest.param("dp2", "sync", marks=SLOW), pytest.param("dp2", "async", marks=SLOW)])
def test_ray_megatron_run_matches_single_process_and_resumes(ray_cluster, local, tmp_path, layout, mode):
    """2 rollouts of 2 megatron ranks (+ 1 local engine, colocated) give the single-process run's rollouts and train/*
    metrics; the rollout-0 checkpoint (HF weights + megatron's distributed checkpoint, written by both ranks) resumes
    into rollout 2 of the uninterrupted run. Async: one layout (the loop's waits move, the group's calls do not)."""
    args = COMMON + [f"train_mode={mode}", *RAY, *LAYOUTS[layout]]
    full = run(tmp_path, "full", args)
    assert_same_run(full, local(mode), f"{layout} {mode} vs single process")
    ck = tmp_path / "full" / "checkpoints" / "rollout_000000"
    hf = "model.safetensors.index.json" if layout == "pp2" else "model.safetensors"  # PP: one file per stage + index
    assert (ck / "megatron" / "metadata.json").is_file() and (ck / hf).is_file()
    resumed = run(tmp_path, "resumed", args + [f"load={ck}"])
    assert [s for s, _ in resumed] == [1, 2]
    assert resumed[0][1] == full[0][1]  # restored history
    for k, v in full[1][1].items():  # rollout 2 after the resume: the uninterrupted run's
        if not k.startswith("perf/"):
            assert resumed[1][1][k] == pytest.approx(v, rel=1e-6, abs=1e-9), (layout, mode, k)


def test_megatron_layout_must_divide_the_train_ranks_named_at_validation():
    """TP × PP × CP must divide the Ray train ranks (the rest is DP); the single process is one rank. Both are refused
    before anything starts, naming the keys; 2 ranks of TP=2 (DP=1) or PP=2 validate, and megatron is driven under Ray."""
    from slime_hydra.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        compose_run(["train=megatron", "cluster.backend=ray", "cluster.actor_num_gpus_per_node=3",
                     "parallelism.tensor_model_parallel_size=2", "rollout.rollout_batch_size=6"])
    text = str(e.value)
    assert ("parallelism.tensor_model_parallel_size × pipeline_model_parallel_size × context_parallel_size = 2 × 1 × 1 = 2 must "
            "divide the train ranks (cluster.actor_num_nodes × cluster.actor_num_gpus_per_node = 1 × 3 = 3)") in text
    assert "does not drive train.backend" not in text
    with pytest.raises(ConfigError) as e:
        compose_run(["train=megatron", "parallelism.pipeline_model_parallel_size=2"])
    assert "= 1 × 2 × 1 = 2 must divide the train ranks (cluster.backend=local: 1)" in str(e.value)
    assert "with cluster.backend=ray" in str(e.value)
    for layout in LAYOUTS.values():
        cfg = compose_run(COMMON + RAY + layout)
        assert (cfg.train.backend, cfg.cluster.backend, cfg.cluster.rollout_num_gpus) == ("megatron", "ray", 1)


def test_a_megatron_collective_past_its_deadline_names_the_call_the_rank_and_the_key(ray_cluster):
    """2 megatron ranks (PP=2) over gloo with cluster.distributed_timeout_s=10: rank 0 alone in a train step waits in
    its first collective with rank 1, gives up after 10 s, and the driver gets a RunError naming the call, the rank
    and the key (before, gloo's RuntimeError traceback); shutdown still returns. The same deadline bounds the ranks'
    group creation in setup, where each new group waits for both ranks: 3 s failed there once on a loaded machine (a
    rank 3 s behind the other), 10 s leaves that margin."""
    import dataclasses
    import time

    from ray.util.placement_group import placement_group, remove_placement_group

    from slime_hydra.app.algorithm import algorithm_specs
    from slime_hydra.errors import RunError
    from slime_hydra.orchestration.calls import RayCalls
    from slime_hydra.orchestration.megatron_group import MegatronTrainGroup
    from slime_hydra.orchestration.placement import plan_layout
    from tests.support.tiny import random_batch

    cfg = compose_run(COMMON + RAY + LAYOUTS["pp2"])
    lay = plan_layout(dataclasses.replace(cfg.cluster, rollout_num_gpus=2, colocate=True), False)
    pg = placement_group([lay.bundle] * lay.num_bundles)
    try:
        group = MegatronTrainGroup(pg, lay, 1, RayCalls(300.0, lambda: "Hint."), distributed_timeout_s=10.0)
        group.setup(cfg.model, cfg.parallelism, algorithm_specs(cfg.algorithm, cfg.train, 1, cfg.rollout.rollout_max_response_len),
                    cfg.train.megatron, 1.0, cfg.seed)
        batch = random_batch(16, 10, 40, seed=0)
        t0 = time.monotonic()
        with pytest.raises(RunError) as e:
            group.calls.get([group.ranks[0].call.remote("train_rollout", batch)], "train step", ["rank 0"])
        waited = time.monotonic() - t0
        msg = str(e.value)
        assert msg.startswith("megatron train_rollout on rank 0 did not complete within cluster.distributed_timeout_s=10 s ("), msg
        assert "another rank is stuck or gone; raise cluster.distributed_timeout_s if it is only slow" in msg, msg
        assert 10.0 <= waited < 40, waited  # megatron's groups keep the seconds (they were rounded to 1 minute)
        t0 = time.monotonic()
        group.shutdown()
        assert time.monotonic() - t0 < 60
    finally:
        remove_placement_group(pg)


# ppo: rewards that differ within a group from the first rollout on, so returns, values and the value loss are not 0
PPO = ["algorithm=ppo", "train.critic_lr=1e-2", "+reward.custom_rm._target_=tests.support.plugins.digit_reward"]


def test_ray_megatron_ppo_matches_single_process(ray_cluster, local, tmp_path):
    """PPO on 2 megatron ranks (TP=2): the critic lives in the ranks (training/megatron/critic.py), `values` and the
    critic's steps are collectives of both; its train/value_* metrics and the policy's equal the single-process run's at
    both rollouts. Rollout 2's advantages come from the values the critic learnt in rollout 1, so they cross the group."""
    got = run(tmp_path, "ray", COMMON + ["train_mode=sync", *PPO, *RAY, *LAYOUTS["tp2"]])
    want = local("sync", PPO)
    assert_same_run(got, want, "tp2 ppo vs single process")
    for step, m in want:
        assert m["train/value_loss"] > 0 and m["train/value_grad_norm"] > 0, step
    assert want[1][1]["train/values_mean"] != 0  # rollout 2: the critic's values moved off the zero head's
