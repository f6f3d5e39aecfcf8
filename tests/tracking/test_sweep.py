"""Multirun sweeps with MLflow lineage: the real Hydra Ray launcher on a local Ray cluster, and the Optuna sweeper."""

from __future__ import annotations

import pytest

from tests.support.runs import FAST, mlflow_db, run_cli

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`


def test_ray_launcher_sweep_logs_parent_and_children(workdir, ray_head):
    """4 jobs through the Hydra Ray launcher on the session's `ray start --head` cluster (one CPU each)."""
    from mlflow.tracking import MlflowClient

    db = mlflow_db(workdir / "mlflow.db")
    args = ["-m", "hydra/launcher=ray", f"hydra.launcher.ray.init.address={ray_head.gcs_address}",
            "+hydra.launcher.ray.init.object_store_memory=null",  # the launcher's CI default is refused by an existing cluster
            "+hydra.launcher.ray.remote.num_cpus=1", f"hydra.sweep.dir={workdir}/sweep", *FAST, "num_rollout=2",
            f"logger.tracking_uri={db}", "seed=1,2", "algorithm=grpo,dr_grpo"]
    proc = run_cli(args, workdir, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| job overrides |" in proc.stdout and "(best)" in proc.stdout  # the sweep summary table
    assert "Jobs ranked by eval/addition/accuracy (max)" in proc.stdout  # logger.sweep_rank_metric's default

    client = MlflowClient(db)
    exp = client.get_experiment_by_name("slime_hydra")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("sweep") == "parent"]
    assert len(parents) == 1
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4 and len(runs) == 5
    combos = {(r.data.params["seed"], r.data.params["algorithm.name"]) for r in children}
    assert combos == {("1", "grpo"), ("2", "grpo"), ("1", "dr_grpo"), ("2", "dr_grpo")}
    for r in children:
        assert r.info.status == "FINISHED"
        assert "rollout/reward_mean" in r.data.metrics and "eval/addition/accuracy" in r.data.metrics
        assert "seed=" in r.data.tags["overrides"] and "algorithm=" in r.data.tags["overrides"]
    dr = [r for r in children if r.data.params["algorithm.name"] == "dr_grpo"]
    assert all(r.data.params["algorithm.grpo_std_normalization"] == "False" for r in dr)
    assert parent.data.tags["best_run_id"] in {r.info.run_id for r in children}
    assert parent.data.tags["rank_metric"] == "eval/addition/accuracy"
    assert "sweep_summary.md" in {a.path for a in client.list_artifacts(parent.info.run_id)}


@pytest.mark.slow  # ~30 s each (the process and its first trial; a further trial adds ~2 s): CI keeps only the sweep above
@pytest.mark.parametrize("launcher", ["basic", "ray_head"])
def test_optuna_sweep_over_lr(launcher, workdir, request):
    """3 Optuna trials over train.lr, in-process (basic launcher) or 2 at a time through the Ray launcher on an
    existing `ray start --head` cluster: each job returns its final eval accuracy, the study's best is the best
    child's, and the MLflow lineage is the sweep's above."""
    import yaml
    from mlflow.tracking import MlflowClient

    db = mlflow_db(workdir / "mlflow.db")
    sweep = workdir / "optuna"
    trials = 3
    args = ["-m", "hydra/sweeper=optuna_maximize", f"hydra.sweeper.n_trials={trials}", "hydra.sweeper.sampler.seed=0",
            f"hydra.sweep.dir={sweep}", *FAST, "eval.skip_eval_before_train=true", "num_rollout=1", f"logger.tracking_uri={db}",
            "train.lr=tag(log,interval(1e-4,1e-2))"]
    if launcher == "ray_head":
        head = request.getfixturevalue("ray_head")
        args += ["hydra/launcher=ray", f"hydra.launcher.ray.init.address={head.gcs_address}",
                 "+hydra.launcher.ray.init.object_store_memory=null",  # the launcher's CI default is refused by an existing cluster
                 "+hydra.launcher.ray.remote.num_cpus=1"]
    proc = run_cli(args, workdir, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]

    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    client = MlflowClient(db)
    runs = client.search_runs([client.get_experiment_by_name("slime_hydra").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == trials and len(runs) == trials + 1
    lrs = [float(r.data.params["train.lr"]) for r in children]
    assert len(set(lrs)) == trials and all(1e-4 <= lr <= 1e-2 for lr in lrs)  # sampled from the interval, one per trial
    for r in children:
        assert r.info.status == "FINISHED" and "train.lr=" in r.data.tags["overrides"]
    acc = {float(r.data.params["train.lr"]): r.data.metrics["eval/addition/accuracy"] for r in children}
    # the objective Optuna saw is what each job returned: its final eval accuracy (one eval set: the mean is it)
    assert result["best_value"] == max(acc.values())
    assert acc[min(acc, key=lambda lr: abs(lr - result["best_params"]["train.lr"]))] == result["best_value"]
    assert {"sweep_summary.md", "optimization_results.yaml"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
