"""The W&B tracker in offline mode, read back from the files it wrote: nothing is sent, nothing is needed but a
directory. And the check that keeps an online run from starting without its key."""

from __future__ import annotations

import pytest

from slime_hydra.config.schema import LoggerConfig
from slime_hydra.tracking import checks
from slime_hydra.tracking.base import build_tracker
from tests.support.runs import problems_of
from tests.support.wandb_files import offline_runs


@pytest.fixture
def wandb_home(tmp_path, monkeypatch):
    """W&B's own settings and caches in the test's directory; no key; offline whatever the shell says."""
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home" / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return tmp_path


def test_metrics_params_tags_and_artifacts_come_back_from_the_offline_files(wandb_home):
    cfg = LoggerConfig(tracker="wandb", wandb_project="proj", wandb_group="grp", tracker_retries=0)
    t = build_tracker(cfg, "exp-run", str(wandb_home / "out"))
    t.log_params({"algorithm.eps_clip": 0.2, "rollout.sglang_env.HF_TOKEN": "***", "data.input_key": "prompt"})
    t.set_tags({"experiment_name": "exp", "overrides": "seed=3"})
    t.log_metrics({"rollout/reward_mean": 0.25, "eval/addition/pass@4": 1.0}, 0)
    t.log_metrics({"rollout/reward_mean": 0.75}, 2)
    t.log_metrics({"rollout/reward_mean": 0.5}, 1)  # sent late (tracking/retrying.py after an outage): kept, at step 1
    samples = wandb_home / "step_1.jsonl"
    samples.write_text('{"reward": 1}\n')
    t.log_artifact(str(samples), "eval/addition")
    t.close()

    (run,) = offline_runs(wandb_home / "out" / "wandb")  # logger.wandb_dir under the output directory
    assert (run.run_id, run.project, run.group, run.name) == (t.run_id, "proj", "grp", "exp-run")
    assert run.series("rollout/reward_mean") == [(0, 0.25), (2, 0.75), (1, 0.5)]
    assert run.series("eval/addition/pass@4") == [(0, 1.0)]  # W&B takes '@' as it is (MLflow's key: pass_at_4)
    assert run.config == {"algorithm.eps_clip": 0.2, "rollout.sglang_env.HF_TOKEN": "***", "data.input_key": "prompt",
                          "tag/experiment_name": "exp", "tag/overrides": "seed=3"}
    assert run.files == ["eval/addition/step_1.jsonl"]
    (copy,) = (wandb_home / "out" / "wandb").glob("wandb/offline-run-*/files/eval/addition/step_1.jsonl")
    assert copy.read_text() == samples.read_text()


def test_a_resumed_run_keeps_its_id_and_its_steps(wandb_home):
    cfg = LoggerConfig(tracker="wandb", tracker_retries=0)
    first = build_tracker(cfg, "r", str(wandb_home / "out"))
    first.log_metrics({"train/loss": 2.0}, 1)
    first.close("KILLED")
    again = build_tracker(cfg, "r", str(wandb_home / "out"), resume_run_id=first.run_id)
    again.log_metrics({"train/loss": 1.0}, 2)
    again.close()
    runs = offline_runs(wandb_home / "out" / "wandb")
    assert [r.run_id for r in runs] == [first.run_id] * 2
    assert [p for r in runs for p in r.series("train/loss")] == [(1, 2.0), (2, 1.0)]


def test_online_needs_the_key_in_the_environment_and_offline_needs_nothing():
    online = LoggerConfig(tracker="wandb", wandb_mode="online")
    (problem,) = checks.check(online, {})
    assert "logger.wandb_mode=online" in problem and "export WANDB_API_KEY=" in problem and "offline" in problem
    assert checks.check(online, {"WANDB_API_KEY": "k" * 40}) == []
    assert checks.check(LoggerConfig(tracker="wandb"), {}) == []  # the default mode is offline
    assert LoggerConfig(tracker="wandb").wandb_mode == "offline"
    assert checks.check(LoggerConfig(tracker="mlflow", wandb_mode="online"), {}) == []  # not the tracker: not read


def test_validation_refuses_an_online_run_without_its_key_and_an_unknown_mode(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (online,) = problems_of(["logger=wandb", "logger.wandb_mode=online"])
    assert online.startswith("logger.wandb_mode=online") and "WANDB_API_KEY" in online
    (mode,) = problems_of(["logger=wandb", "logger.wandb_mode=shared"])
    assert "logger.wandb_mode" in mode and "offline" in mode
