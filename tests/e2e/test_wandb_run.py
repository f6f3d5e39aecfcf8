"""`logger=wandb` through the CLI on the embedded default: the run's metrics and its masked config reach the offline W&B
run, a secret given on the command line reaches no file, and nothing needs the network."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_redaction import files_holding
from tests.support.runs import FAST, run_cli
from tests.support.wandb_files import offline_runs

pytestmark = pytest.mark.integration  # a whole CLI run


def test_a_wandb_run_holds_the_runs_metrics_and_no_secret(tmp_path, monkeypatch):
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home" / var.lower()))
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline comes from the config's default, not the shell
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    secret = "SECRET" + "w4Nd"
    run = tmp_path / "run"
    args = [*FAST, "logger=wandb", "logger.wandb_group=addition", "num_rollout=2", f"hydra.run.dir={run}",
            f"reward.rm_url=https://u:{secret}@host/x", f"+rollout.sglang_env.HF_TOKEN={secret}"]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    (wb,) = offline_runs(run / "wandb")
    name = wb.config["tag/experiment_name"]  # the run's name, as MLflow gets it
    assert (wb.name, wb.group, wb.project) == (name, "addition", "slime_hydra") and name.startswith("grpo/")
    summary = json.loads((run / "summary.json").read_text())
    assert "rollout/reward_mean" in summary and "eval/addition/accuracy" in summary
    for key, s in summary.items():  # the same points the run's own summary holds, last value and count
        points = wb.series(key)
        assert (len(points), points[-1][1]) == (s["count"], pytest.approx(s["last"])), key
    assert [s for s, _ in wb.series("rollout/reward_mean")] == [1, 2]
    assert wb.config["reward.rm_url"] == "https://***@host/x" and wb.config["rollout.sglang_env.HF_TOKEN"] == "***"
    assert wb.config["rollout.n_samples_per_prompt"] == 4
    assert "composed_config.yaml" in wb.files
    assert files_holding(tmp_path, secret.encode()) == []
    assert not (tmp_path / "mlruns.db").exists()  # the MLflow store is not opened
