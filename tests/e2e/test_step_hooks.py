"""slime's step hooks in whole runs: a wrong hook stops the CLI before any model (exit 2, every key named); the hooks'
effects reach MLflow; a data source's run resumes exactly; and the hooks run under cluster.backend=ray, the megatron
ones in every train rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_hydra.app.preflight import compose_run
from slime_hydra.config.checks_hooks import STEP_HOOKS
from tests.support.megatron_cpu import shim
from tests.support.runs import FAST, mlflow_db, run_cli
from tests.support.servers import join_ray

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`

HOOKS = "tests.support.step_hooks"
SOURCE = f"++data.data_source._target_={HOOKS}.AdditionSource"
# the driver's hooks: log functions, eval function, reward post-process, data source, TIS and the pg-loss reducer
DRIVER = [f"++logger.custom_rollout_log_function._target_={HOOKS}.log_best_reward",
          f"++logger.custom_eval_rollout_log_function._target_={HOOKS}.log_eval_sizes",
          f"++eval.eval_function._target_={HOOKS}.greedy_eval", "eval.n_samples_per_eval_prompt=2",
          f"++reward.custom_reward_post_process._target_={HOOKS}.rank_rewards", SOURCE, "algorithm.use_tis=true",
          f"++algorithm.custom_tis_function._target_={HOOKS}.rejection_tis",
          f"++algorithm.custom_pg_loss_reducer_function._target_={HOOKS}.constant_sum_reducer"]


def test_a_wrong_hook_stops_the_cli_before_any_model(tmp_path):
    """All 11 hooks with a path that does not import, then all 11 with a function whose signature cannot take the step's
    call: exit 2, each key named, nothing written (no checkpoint, no MLflow store)."""
    for target, says in ((f"{HOOKS}.no_such_hook", " does not import"), ("tests.support.plugins.digit_reward", ": signature")):
        run = run_cli([*FAST, f"hydra.run.dir={tmp_path}/run", f"logger.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
                       *[f"++{key}._target_={target}" for key in STEP_HOOKS]], tmp_path, timeout=300)
        assert run.returncode == 2, run.stderr[-2000:]
        for key in STEP_HOOKS:
            assert f"{key}._target_={target}{says}" in run.stderr, (key, run.stderr[-4000:])
        assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "mlflow.db").exists()


def test_the_hooks_effects_reach_mlflow(tmp_path):
    """2 rollouts of 8 prompt groups × 4 samples through the CLI. The data source served 8, then 16 groups; the rollout
    log function's metric is the best raw reward at steps 1 and 2; the eval log function's counts the eval set's 200
    prompts × 2 samples at steps 0 and 2; rank_rewards makes every group's rewards distinct (ranks 0..3), so no sample
    has a zero advantage and all 8 × 4 = 32 train, whatever the raw rewards; the TIS function's metric is logged."""
    from mlflow.tracking import MlflowClient

    db = mlflow_db(tmp_path / "mlflow.db")
    run = run_cli([*FAST, "num_rollout=2", f"hydra.run.dir={tmp_path}/run", f"logger.tracking_uri={db}", *DRIVER],
                  tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    client = MlflowClient(tracking_uri=db)
    (mlrun,) = client.search_runs([client.get_experiment_by_name("slime_hydra").experiment_id])

    def history(name: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(mlrun.info.run_id, name))

    assert history("data/custom_groups_served") == [(1, 8.0), (2, 16.0)]
    assert [s for s, _ in history("custom/best_reward")] == [1, 2]
    assert history("custom/addition_samples") == [(0, 400.0), (2, 400.0)]
    assert history("train/kept_samples") == [(1, 32.0), (2, 32.0)]
    assert [s for s, _ in history("train/tis_rejected")] == [1, 2]


def test_a_data_source_run_resumes_exactly(tmp_path):
    """The run resumed from the checkpoint after rollout 2 logs what the uninterrupted run logs at rollouts 3 and 4:
    the source's position is in the checkpoint, so it serves the same prompts."""
    from slime_hydra.app.session import run_session
    from slime_hydra.engine.checkpoint import load_state

    def run(name: str, extra: list[str]) -> list:
        args = [*FAST, "logger=none", "seed=5", "num_rollout=4", SOURCE, *extra]
        run_session(compose_run(args), str(tmp_path / name), args)
        return load_state(tmp_path / name / "checkpoints" / "rollout_000003")["history"]

    full = run("full", ["save_interval=2"])
    resumed = run("resumed", [f"load={tmp_path}/full/checkpoints/rollout_000001"])
    assert [s for s, _ in resumed] == [s for s, _ in full] == [0, 1, 2, 3, 4]
    for (s, a), (_, b) in zip(full, resumed):
        same = {k: v for k, v in a.items() if not k.startswith("perf/")}
        assert same == {k: v for k, v in b.items() if not k.startswith("perf/")}, s
    assert [m["data/custom_groups_served"] for s, m in full if s] == [8.0, 16.0, 24.0, 32.0]


@pytest.fixture(scope="module")
def ray_cluster(ray_head):
    """This process joins the session's cluster; every worker process of this job installs the CPU shim first."""
    import ray

    shim.install()
    root = str(Path(__file__).resolve().parents[2])  # the shim's hook is imported in each worker
    join_ray(ray_head, "step_hooks", worker_process_setup_hook="tests.support.megatron_cpu.shim.install",
             env_vars={"PYTHONPATH": root})
    yield ray_head.gcs_address
    ray.shutdown()


def test_the_hooks_run_under_ray_the_megatron_ones_in_every_rank(ray_cluster, tmp_path):
    """2 megatron ranks (DP=2) as Ray actors, 2 rollouts of 2 optimizer steps: the init hook ran once in each rank, the
    train-step hook before each step in each rank ((rollout, step) = (0, 0), (0, 1), (1, 0), (1, 1), twice), the log-prob
    hook before each rollout's old log-probs (its second step's) in each rank; the driver's hooks logged as in one process."""
    import json

    from slime_hydra.app.session import run_session
    from slime_hydra.engine.checkpoint import load_state

    rank = "++train.custom_megatron_{}={{_target_:" + HOOKS + ".{},path:'{}'}}"
    args = [*FAST, "train=megatron", "logger=none", "seed=5", "num_rollout=2", "rollout.rollout_batch_size=4",
            "train.micro_batch_size=4", "train.num_steps_per_rollout=2", "eval.skip_eval_before_train=true",
            "cluster.backend=ray", "cluster.actor_num_gpus_per_node=2", "cluster.colocate=true", "cluster.rollout_num_gpus=1",
            "parallelism.use_distributed_optimizer=true", *DRIVER,
            rank.format("init", "record_init", tmp_path / "init"),
            rank.format("before_log_prob_hook", "record_log_prob_pass", tmp_path / "log_prob.jsonl"),
            rank.format("before_train_step_hook", "record_train_step", tmp_path / "step.jsonl")]
    run_session(compose_run(args), str(tmp_path / "run"), args)
    assert [(tmp_path / f"init.rank{r}").read_text() for r in (0, 1)] == ["init\n", "init\n"]
    steps = [json.loads(line) for line in (tmp_path / "step.jsonl").read_text().splitlines()]
    assert sorted((s["rollout_id"], s["step_id"]) for s in steps) == sorted([(r, i) for r in (0, 1) for i in (0, 1)] * 2)
    passes = [json.loads(line) for line in (tmp_path / "log_prob.jsonl").read_text().splitlines()]
    assert passes == [{"store_prefix": "", "chunks": 1}] * 4
    history = load_state(tmp_path / "run" / "checkpoints" / "rollout_000001")["history"]
    assert [m["data/custom_groups_served"] for _, m in history] == [4.0, 8.0]
    # 4 groups × 4 samples in 2 steps of 8, every one kept (the ranks' rewards are distinct): 8 a step, averaged
    assert all("custom/best_reward" in m and m["train/kept_samples"] == 8.0 for _, m in history)
    assert history[-1][1]["custom/addition_samples"] == 400.0
