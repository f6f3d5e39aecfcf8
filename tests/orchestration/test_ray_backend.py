"""cluster.backend=ray on one real Ray cluster (the session's `ray start --head`, 16 logical CPUs): layout, checks, DP, a run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from slime_hydra.app.preflight import compose_run
from slime_hydra.config.schema import ClusterConfig
from slime_hydra.errors import ConfigError
from slime_hydra.orchestration.placement import layout_problems, plan_layout
from tests.support.runs import FAST, mlflow_db, run_cli
from tests.support.servers import RAY_HEAD_CPUS, join_ray
from tests.support.tiny import random_batch

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`


@pytest.fixture(scope="module")
def ray_cluster(ray_head):
    """This process joins the session's `ray start --head` cluster as a driver, in this module's namespace."""
    import ray

    join_ray(ray_head, "ray_backend")
    yield ray_head.gcs_address
    ray.shutdown()


def _cluster(**kw) -> ClusterConfig:
    return ClusterConfig(**{"backend": "ray", **kw})


def test_plan_layout_actor_slice_then_rollout_slice():
    lay = plan_layout(_cluster(actor_num_gpus_per_node=4, rollout_num_gpus=4, rollout_num_gpus_per_engine=2, colocate=False), True)
    assert lay.actor_bundles == (0, 1, 2, 3) and lay.engine_bundles == ((4, 5), (6, 7)) and lay.num_bundles == 8
    assert lay.bundle == {"GPU": 1.0, "CPU": 1.0} and lay.actor_options() == {"num_cpus": 1.0, "num_gpus": 1.0}
    co = plan_layout(_cluster(actor_num_nodes=2, actor_num_gpus_per_node=4, rollout_num_gpus=8, colocate=True), False)
    assert co.actor_bundles == tuple(range(8)) and co.engine_bundles == tuple((i,) for i in range(8)) and co.num_bundles == 8
    assert co.bundle == {"CPU": 1.0} and co.actor_options() == {"num_cpus": 0.5, "num_gpus": 0}  # shared by halves


def test_layout_problems_name_the_keys():
    c = _cluster(actor_num_gpus_per_node=8, rollout_num_gpus=8, colocate=False)
    (msg,) = layout_problems(c, plan_layout(c, True), {"GPU": 8.0, "CPU": 64.0}, 8.0, "test")
    # 8 train + 8 rollout bundles on 8 GPUs
    assert "= 16 bundle(s) of {GPU: 1}" in msg and "has 8 GPU" in msg and "set cluster.colocate=true" in msg
    c = _cluster(actor_num_gpus_per_node=8, rollout_num_gpus=8, colocate=True)
    (msg,) = layout_problems(c, plan_layout(c, True), {"GPU": 8.0, "CPU": 64.0}, 4.0, "test")  # 2 nodes of 4
    assert "cluster.actor_num_gpus_per_node=8" in msg and "raise cluster.actor_num_nodes" in msg


def test_static_cluster_checks_report_every_problem():
    with pytest.raises(ConfigError) as e:
        compose_run(["cluster.actor_num_gpus_per_node=2", "cluster.rollout_num_gpus=3", "cluster.rollout_num_gpus_per_engine=2"])
    text = str(e.value)
    assert "cluster.rollout_num_gpus=3 is not divisible by cluster.rollout_num_gpus_per_engine=2" in text
    assert "need cluster.backend=ray" in text  # 2 ranks with the in-process backend
    assert "a rollout.backend=local engine runs on one device" in text
    with pytest.raises(ConfigError, match="cluster.rollout_num_gpus is not set and cluster.colocate=false"):
        compose_run(["cluster.backend=ray", "cluster.colocate=false"])
    cfg = compose_run(["cluster.backend=ray", "cluster.actor_num_gpus_per_node=2"])
    assert (cfg.cluster.rollout_num_gpus, cfg.cluster.offload_train, cfg.cluster.offload_rollout) == (2, True, True)  # slime's derivations


def test_layout_the_cluster_cannot_hold_exits_2_before_any_actor(ray_cluster, workdir):
    # one train rank more than the cluster has CPUs + 1 rollout bundle, not colocated (joined by address)
    ranks = RAY_HEAD_CPUS + 1
    proc = run_cli([*FAST, "logger=none", "num_rollout=1", "cluster.backend=ray", f"cluster.address={ray_cluster}",
                    f"cluster.actor_num_gpus_per_node={ranks}", "cluster.colocate=false", "cluster.rollout_num_gpus=1",
                    f"rollout.rollout_batch_size={2 * ranks}", "train.micro_batch_size=8"], workdir, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"= {ranks + 1} bundle(s) of {{CPU: 1}}, but the Ray cluster (cluster.address=" in proc.stderr
    assert f"has {RAY_HEAD_CPUS} CPU" in proc.stderr
    assert "set cluster.colocate=true" in proc.stderr
    assert not (workdir / "outputs").exists() or not list((workdir / "outputs").rglob("checkpoints"))


# token_mean (the step's token count summed over ranks) in the default tier; sample_token_mean (~20 s) slow
@pytest.mark.parametrize("aggregation", ["token_mean", pytest.param("sample_token_mean", marks=pytest.mark.slow)])
def test_two_dp_ranks_match_one_rank_float64(ray_cluster, aggregation):
    """2 gloo ranks, each with half of every step's samples, end with the parameters of 1 rank on the whole batch."""
    from ray.util.placement_group import placement_group, remove_placement_group

    from slime_hydra.app.algorithm import algorithm_specs
    from slime_hydra.models.build import build_model, build_tokenizer
    from slime_hydra.orchestration.calls import RayCalls
    from slime_hydra.orchestration.train_group import TrainGroup
    from tests.support.trainers import torch_backend

    cfg = compose_run(FAST + ["model.dtype=float64", f"algorithm.loss_aggregation={aggregation}", "num_rollout=1",
                              "train.num_steps_per_rollout=2", "train.micro_batch_size=2", "train.lr=1e-2"])
    # 8 prompts × 4 samples = 32 = global_batch_size 16 × 2 steps; each rank gets 8 of each step's 16
    batch = random_batch(32, 10, 40, seed=0)
    tok = build_tokenizer(cfg.model)
    one = torch_backend(build_model(cfg.model, tok, cfg.seed), cfg.algorithm, cfg.train, 1.0, 2, torch.device("cpu"),
                            max_response_len=cfg.rollout.rollout_max_response_len, model_impl=cfg.model.model_impl)
    m1 = one.train_rollout(batch)

    lay = plan_layout(dataclasses.replace(cfg.cluster, backend="ray", actor_num_gpus_per_node=2, rollout_num_gpus=2), False)
    pg = placement_group([lay.bundle] * lay.num_bundles)
    try:
        group = TrainGroup(pg, lay, 1, None, None, RayCalls(cfg.cluster.ray_call_timeout_s), cfg.cluster.distributed_timeout_s)
        group.setup(cfg.model, algorithm_specs(cfg.algorithm, cfg.train, 2, cfg.rollout.rollout_max_response_len), 1.0, cfg.seed)
        m2 = group.train_rollout(batch)
        p0, p1 = group.parameters(0), group.parameters(1)
        group.shutdown()
    finally:
        remove_placement_group(pg)
    ref = [p.detach() for p in one.params]
    assert all(p.dtype == torch.float64 for p in p0)
    assert max((a - b).abs().max().item() for a, b in zip(p0, p1)) == 0.0  # ranks agree bit for bit
    assert max((a - b).abs().max().item() for a, b in zip(p0, ref)) < 1e-10
    assert max((a - b).abs().max().item() for a, b in zip(p0, [q.detach() for q in build_model(cfg.model, tok, cfg.seed).parameters()])) > 1e-4
    assert m2.keys() == m1.keys()
    for k in m1:  # each rank's metrics are its share of the step's: they add up to one rank's
        assert m2[k] == pytest.approx(m1[k], rel=1e-9, abs=1e-12), k


def test_ray_backend_run_matches_in_process_run(ray_cluster, tmp_path):
    """2 train ranks + 1 engine (its sampler seeded as the in-process one): the first rollout is identical, training
    agrees to float32 rounding, and both ranks log into the driver's MLflow run by run id."""
    import json

    from mlflow.tracking import MlflowClient

    from slime_hydra.app.session import run_session

    db = mlflow_db(tmp_path / "mlflow.db")
    common = FAST + ["num_rollout=2", "save_interval=2", f"logger.tracking_uri={db}"]
    run_session(compose_run(common), str(tmp_path / "local"), common)
    ray_args = common + ["cluster.backend=ray", "cluster.actor_num_gpus_per_node=2", "cluster.rollout_num_gpus=1"]
    run_session(compose_run(ray_args), str(tmp_path / "ray"), ray_args)

    local = json.loads((tmp_path / "local" / "summary.json").read_text())
    dist = json.loads((tmp_path / "ray" / "summary.json").read_text())
    for k in ("rollout/reward_mean", "rollout/response_len_mean", "eval/addition/accuracy"):
        assert dist[k]["first"] == local[k]["first"], k  # same weights, same sampler: same first rollout and eval
    train_keys = sorted(k for k in local if k.startswith("train/"))
    assert train_keys == sorted(k for k in dist if k.startswith("train/"))
    for k in train_keys:  # 2 ranks' shares add up to the one-rank metric, to float32 rounding
        assert dist[k]["first"] == pytest.approx(local[k]["first"], rel=1e-4, abs=1e-6), k
    assert (tmp_path / "ray" / "checkpoints" / "rollout_000001" / "model.safetensors").is_file()

    client = MlflowClient(db)
    runs = client.search_runs([client.get_experiment_by_name("slime_hydra").experiment_id])
    (ray_run,) = [r for r in runs if r.data.params["cluster.backend"] == "ray"]
    assert ray_run.info.status == "FINISHED"
    for rank in (0, 1):  # logged by the rank actors themselves
        assert [m.step for m in client.get_metric_history(ray_run.info.run_id, f"perf/rank{rank}_train_time_s")] == [1, 2]


@pytest.mark.slow
def test_custom_generate_hook_runs_over_the_ray_engines(ray_cluster, tmp_path):
    """The calculator agent on the Ray path (1 train rank + 1 engine): its multi-turn hook runs in the driver over the
    rollout manager's engine. After the same 25-step warm start, the first eval and rollout (tool calls, masked
    observation tokens, rewards) are those of the in-process run: same weights, same sampler seed, same batching."""
    import json

    from slime_hydra.app.session import run_session

    common = ["experiment=agent/qwen3-tiny-calculator-cpu-local-torch-v1", "logger=none", "logger.progress_bar=false",
              "num_rollout=1", "warmstart.steps=25", "rollout.rollout_batch_size=4", "rollout.n_samples_per_prompt=4",
              "train.micro_batch_size=16", "eval.eval_interval=null"]
    run_session(compose_run(common), str(tmp_path / "local"), common)
    ray_args = common + ["cluster.backend=ray"]
    run_session(compose_run(ray_args), str(tmp_path / "ray"), ray_args)

    local = json.loads((tmp_path / "local" / "summary.json").read_text())
    dist = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert dist["eval/multiplication/tool_calls_mean"]["first"] > 0.5  # the warm-started model calls the tool
    assert dist["rollout/masked_token_frac"]["first"] > 0.1  # tool results were appended as masked observations
    for k in ("rollout/turns_mean", "rollout/tool_calls_mean", "rollout/masked_token_frac", "rollout/tool_error_rate",
              "rollout/reward_mean", "eval/multiplication/accuracy", "eval/multiplication/tool_calls_mean"):
        assert dist[k]["first"] == pytest.approx(local[k]["first"], abs=1e-9), k


def test_ray_ppo_matches_in_process_ppo(ray_cluster, tmp_path):
    """PPO on 2 torch ranks: the critic's value-loss denominators are summed and its gradients all-reduced over the
    ranks (the trainer's training/distributed.DataParallel collectives, which its critic takes too), so its train/value_* metrics and the policy's agree with one
    process to float32 rounding. Without the all-reduce each rank's critic would step on half the gradient: the
    ranks' value_grad_norm (reported by rank 0) would be about half the one-process norm and the loss would differ."""
    import json

    from slime_hydra.app.session import run_session

    # rewards that differ within a group from the first rollout on: returns, values and the value loss are not 0
    common = FAST + ["algorithm=ppo", "logger=none", "num_rollout=2", "save_interval=null", "eval=none",
                     "+reward.custom_rm._target_=tests.support.plugins.digit_reward"]
    run_session(compose_run(common), str(tmp_path / "local"), common)
    ray_args = common + ["cluster.backend=ray", "cluster.actor_num_gpus_per_node=2", "cluster.rollout_num_gpus=1"]
    run_session(compose_run(ray_args), str(tmp_path / "ray"), ray_args)
    local = json.loads((tmp_path / "local" / "summary.json").read_text())
    dist = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert dist["rollout/reward_mean"]["first"] == local["rollout/reward_mean"]["first"]  # same first rollout
    value_keys = sorted(k for k in local if k.startswith("train/value"))
    assert "train/value_grad_norm" in value_keys and "train/value_loss" in value_keys
    assert sorted(k for k in dist if k.startswith("train/")) == sorted(k for k in local if k.startswith("train/"))
    assert local["train/value_loss"]["first"] > 0 and local["train/value_grad_norm"]["first"] > 0
    for k in sorted(k for k in local if k.startswith("train/")):
        for at in ("first", "last"):  # the last: rollout 2, after both critics (and policies) stepped
            assert dist[k][at] == pytest.approx(local[k][at], rel=1e-4, abs=1e-6), (k, at)


def test_ray_refuses_what_it_cannot_drive_at_validation(workdir):
    """What Ray does not drive yet (colocated engines over nodes that each hold one pipeline stage's ranks: handles to
    the other stage's tensors would have to cross nodes) stops the run at validation with exit 2, every key named at
    once, before Ray starts and before any data or model loads. Megatron ranks with SGLang engines
    (tests/orchestration/test_megatron_sglang.py), on two nodes and with pipeline stages (tests/orchestration/
    test_multi_node.py), each on its own (tests/orchestration/test_megatron_group.py, tests/orchestration/
    test_sglang_engines.py) and PPO's critic on torch ranks (test_ray_ppo_matches_in_process_ppo) and megatron ranks
    (test_megatron_group.py) are driven."""
    proc = run_cli([*FAST, "logger=none", "num_rollout=1", "cluster.backend=ray", "train=megatron", "rollout=sglang",
                    "algorithm=ppo", "cluster.colocate=true", "cluster.actor_num_nodes=2", "cluster.actor_num_gpus_per_node=1",
                    "parallelism.pipeline_model_parallel_size=2"], workdir, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "cluster.backend=ray does not drive train.backend=megatron with rollout.backend=sglang" not in proc.stderr
    assert ("cluster.backend=ray does not drive rollout.weight_sync=tensor (the default with cluster.colocate=true) with "
            "parallelism.pipeline_model_parallel_size=2 over cluster.actor_num_nodes=2 nodes") in proc.stderr, proc.stderr[-3000:]
    assert "set cluster.colocate=false (update groups reach other nodes)" in proc.stderr
    assert "needs a critic" not in proc.stderr  # megatron has one (training/megatron/critic.py)
    assert "does not drive algorithm" not in proc.stderr
    assert not (workdir / "outputs").exists() or not list((workdir / "outputs").rglob("checkpoints"))
