"""A multirun sweep through the real Hydra Ray launcher on a local Ray cluster, with MLflow lineage."""

from __future__ import annotations

import tempfile

from tests.conftest import FAST, run_cli


def test_ray_launcher_sweep_logs_parent_and_children(workdir, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("RAY_TMPDIR", tempfile.mkdtemp(prefix="r", dir="/tmp"))  # AF_UNIX paths must stay short
    db = f"sqlite:///{workdir}/mlflow.db"
    args = ["-m", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2", "+hydra.launcher.ray.init.include_dashboard=false",
            "+hydra.launcher.ray.remote.num_cpus=1", f"hydra.sweep.dir={workdir}/sweep", *FAST, "num_rollout=2",
            f"logger.tracking_uri={db}", "seed=1,2", "algorithm=grpo,dr_grpo"]
    proc = run_cli(args, workdir, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| job overrides |" in proc.stdout and "(best)" in proc.stdout  # the sweep summary table

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
    assert "sweep_summary.md" in {a.path for a in client.list_artifacts(parent.info.run_id)}
