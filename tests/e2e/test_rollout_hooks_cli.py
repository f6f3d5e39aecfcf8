"""slime's rollout hooks through the CLI: a wrong `_target_` path or signature of any of them is exit 2, each key named,
before anything starts; the two-agent example (one generate hook, a solver and a checker sample per prompt sample)
raises its reward (slow)."""

from __future__ import annotations

import pytest

from tests.support.runs import FAST, run_cli

pytestmark = pytest.mark.integration  # whole CLI runs: not in `make test-fast`

PLUGINS = "tests.support.rollout_plugins"
KEYS = ("rollout_function", "rollout_sample_filter", "rollout_all_samples_process", "custom_convert_samples_to_train_data",
        "rollout_data_postprocess")


def test_wrong_hook_paths_and_signatures_exit_2_naming_every_key_before_anything_starts(workdir):
    wrong_path = [f"+rollout.{k}._target_={PLUGINS}.no_such_{k}" for k in KEYS]
    proc = run_cli(FAST + ["logger=none", f"hydra.run.dir={workdir}/run", *wrong_path,
                           f"+rollout.custom_generate._target_={PLUGINS}.no_such_generate"], workdir, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    for k in (*KEYS, "custom_generate"):
        assert f"rollout.{k}._target_={PLUGINS}.no_such_" in proc.stderr and "does not import" in proc.stderr, k
    wrong_sig = [f"+rollout.{k}._target_={PLUGINS}.takes_nothing" for k in KEYS]
    proc = run_cli(FAST + ["logger=none", f"hydra.run.dir={workdir}/run", *wrong_sig,
                           f"+rollout.custom_generate._target_={PLUGINS}.generate_without_kwargs"], workdir, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    for k in KEYS:
        assert f"rollout.{k}._target_={PLUGINS}.takes_nothing: signature () does not fit the call fn(" in proc.stderr, k
    assert f"rollout.custom_generate._target_={PLUGINS}.generate_without_kwargs: signature (sample) does not fit" in proc.stderr
    assert not (workdir / "run" / "composed_config.yaml").exists()  # the run never started: nothing written, no model


def mean_of(history: list, first: bool, n: int = 10) -> float:
    values = [m.value for m in sorted(history, key=lambda m: m.step)]
    part = values[:n] if first else values[-n:]
    return sum(part) / len(part)


@pytest.mark.slow
def test_solver_and_checker_from_one_generate_hook_raise_their_reward(workdir):
    """experiments/agent/qwen3-tiny-solver-checker-cpu-local-torch-v1 through the CLI: every prompt sample trains as
    two (a group of 8 is 16), and the reward of both agents rises from the first ten rollouts to the last ten
    (measured: solver 0.167 -> 0.352, checker 0.146 -> 0.373, both 0.157 -> 0.362; eval 0.29 -> 0.54)."""
    from mlflow.tracking import MlflowClient

    from tests.support.runs import mlflow_db

    db = mlflow_db(workdir / "mlflow.db")
    proc = run_cli(["experiment=agent/qwen3-tiny-solver-checker-cpu-local-torch-v1", f"logger.tracking_uri={db}",
                    "logger.progress_bar=false", f"hydra.run.dir={workdir}/run"], workdir, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(db)
    (run,) = client.search_runs([client.get_experiment_by_name("slime_hydra").experiment_id])
    history = {k: client.get_metric_history(run.info.run_id, f"rollout/{k}")
               for k in ("reward_mean", "solver_reward_mean", "checker_reward_mean")}
    assert all(len(h) == 200 for h in history.values())
    for k, h in history.items():
        assert mean_of(h, first=False) > mean_of(h, first=True) + 0.1, (k, mean_of(h, True), mean_of(h, False))
    acc = sorted(client.get_metric_history(run.info.run_id, "eval/addition/accuracy"), key=lambda m: m.step)
    assert acc[-1].value > acc[0].value + 0.1  # the solver, greedy on held-out sums
