"""The sweep summary's ranking: which metric ranks the jobs, which job is best, and the message a
`logger.sweep_rank_metric` no job reported gives; over fake job results, then the callback's tags on a real sqlite
store with child runs logged by hand (no sweep is run: tests/tracking/test_sweep.py runs real ones)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slime_hydra.errors import ConfigError
from slime_hydra.tracking.sweep import rank_metric, summary_table


def job(run_id: str, overrides: str, metrics: dict[str, float]):
    """What the callback reads of a child run: id, status, overrides tag, last value of each metric."""
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status="FINISHED"),
                           data=SimpleNamespace(tags={"overrides": overrides}, metrics=metrics))


JOBS = [
    job("a", "seed=1 algorithm=grpo", {"eval/gsm8k/accuracy": 0.40, "eval/math/accuracy": 0.9, "rollout/reward_mean": 0.30}),
    job("b", "seed=2 algorithm=grpo", {"eval/gsm8k/accuracy": 0.55, "eval/math/accuracy": 0.1, "rollout/reward_mean": 0.10}),
    job("c", "seed=3 algorithm=grpo", {"eval/gsm8k/accuracy": 0.50, "eval/math/accuracy": 0.5, "rollout/reward_mean": 0.20}),
]
REPORTED = {k for j in JOBS for k in j.data.metrics}


def test_default_ranks_by_the_first_eval_accuracy_reported_whatever_the_eval_set():
    """No eval set is called `addition` here: the default is the first eval/<set>/accuracy by name, highest best."""
    metric = rank_metric(REPORTED, None)
    assert metric == "eval/gsm8k/accuracy"  # before eval/math/accuracy
    table, best = summary_table(JOBS, metric, "max")
    assert best.info.run_id == "b"  # 0.55
    lines = table.splitlines()
    assert lines[0] == "Jobs ranked by eval/gsm8k/accuracy (max)"
    assert lines[2] == "| job overrides | status | eval/gsm8k/accuracy | eval/math/accuracy | rollout/reward_mean |"
    assert "| seed=2 (best) | FINISHED | 0.5500 | 0.1000 | 0.1000 |" in lines
    assert "| seed=1 | FINISHED | 0.4000 | 0.9000 | 0.3000 |" in lines  # algorithm=grpo is common: not shown


def test_default_falls_back_to_the_mean_reward_without_an_eval_accuracy():
    jobs = [job("a", "seed=1", {"rollout/reward_mean": 0.3, "train/loss": 1.0}),
            job("b", "seed=2", {"rollout/reward_mean": 0.6, "train/loss": 2.0})]
    metric = rank_metric({k for j in jobs for k in j.data.metrics}, None)
    assert metric == "rollout/reward_mean"
    assert summary_table(jobs, metric, "max")[1].info.run_id == "b"
    assert rank_metric({"train/loss"}, None) is None  # nothing to rank by: a table with no best
    table, best = summary_table(jobs, None, "max")
    assert best is None and table.startswith("Jobs not ranked") and "(best)" not in table


def test_a_named_metric_and_min_direction_pick_the_lowest():
    metric = rank_metric(REPORTED, "rollout/reward_mean")
    table, best = summary_table(JOBS, metric, "min")
    assert best.info.run_id == "b"  # reward 0.10 is the lowest
    lines = table.splitlines()
    assert lines[0] == "Jobs ranked by rollout/reward_mean (min)"
    # the ranking metric comes first, then the eval accuracies
    assert lines[2] == "| job overrides | status | rollout/reward_mean | eval/gsm8k/accuracy | eval/math/accuracy |"
    assert "| seed=2 (best) | FINISHED | 0.1000 | 0.5500 | 0.1000 |" in lines
    assert summary_table(JOBS, metric, "max")[1].info.run_id == "a"


def test_a_named_metric_some_jobs_lack_ranks_the_others():
    jobs = [*JOBS, job("d", "seed=4 algorithm=grpo", {"rollout/reward_mean": 0.05})]  # a job that never evaluated
    table, best = summary_table(jobs, "eval/math/accuracy", "min")
    assert best.info.run_id == "b"
    assert "| seed=4 | FINISHED | - | - | 0.0500 |" in table.splitlines()


def test_a_metric_no_job_reported_names_the_key_and_the_nearest_names():
    with pytest.raises(ConfigError) as e:
        rank_metric(REPORTED, "eval/gsm8k/acuracy")
    text = str(e.value)
    assert "logger.sweep_rank_metric='eval/gsm8k/acuracy'" in text and "no job of the sweep reported" in text
    assert "eval/gsm8k/accuracy" in text  # the nearest name it could be


def sweep_config(uri: str, sweep_dir: str, rank_metric: str | None, direction: str = "max"):
    """What the callback reads of the driver's config: the logger group and the hydra node."""
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "experiment_name": "exp",
        "logger": {"tracker": "mlflow", "tracking_uri": uri, "mlflow_experiment": "sweeps",
                   "sweep_rank_metric": rank_metric, "sweep_rank_direction": direction},
        "hydra": {"runtime": {"cwd": sweep_dir}, "overrides": {"task": ["seed=1,2"]}, "sweep": {"dir": sweep_dir}}})


@pytest.mark.parametrize("named,direction,best", [(None, "max", "2"), ("rollout/reward_mean", "min", "2"),
                                                  ("rollout/reward_mea", "max", None)])
def test_the_callback_tags_the_parent_with_the_ranked_best(tmp_path, capsys, named, direction, best):
    """Against a real sqlite store (no jobs run: two child runs logged by hand) the parent gets the best job by the
    rank metric, the metric's name and the table; a metric no job reported gives no best and an error naming the key."""
    from mlflow.tracking import MlflowClient

    from slime_hydra.tracking.sweep import MlflowSweepCallback, parent_run_id
    from tests.support.runs import mlflow_db

    uri = mlflow_db(tmp_path / "mlflow.db")
    cfg = sweep_config(uri, str(tmp_path / "sweep"), named, direction)
    callback = MlflowSweepCallback()
    callback.on_multirun_start(cfg)
    parent = parent_run_id(str(tmp_path / "sweep"))
    client = MlflowClient(uri)
    exp_id = client.get_run(parent).info.experiment_id
    ids = {}
    for seed, acc, reward in (("1", 0.2, 0.5), ("2", 0.7, 0.1)):
        run = client.create_run(exp_id, tags={"mlflow.parentRunId": parent, "overrides": f"seed={seed}"})
        client.log_metric(run.info.run_id, "eval/countdown/accuracy", acc)
        client.log_metric(run.info.run_id, "rollout/reward_mean", reward)
        client.set_terminated(run.info.run_id)
        ids[seed] = run.info.run_id
    callback.on_multirun_end(cfg)

    tags = client.get_run(parent).data.tags
    out, err = capsys.readouterr()
    assert tags["best_run_id"] == (ids[best] if best else "none")
    summary = (tmp_path / "sweep" / "sweep_summary.md").read_text()
    if best is None:
        assert tags["rank_metric"] == "none" and "(best)" not in summary
        assert "logger.sweep_rank_metric='rollout/reward_mea'" in err and "rollout/reward_mean" in err
        assert "logger.sweep_rank_metric='rollout/reward_mea'" in summary
    else:
        metric = named or "eval/countdown/accuracy"
        assert tags["rank_metric"] == metric and f"Jobs ranked by {metric} ({direction})" in out
        assert "| seed=2 (best) |" in summary and "error:" not in err
