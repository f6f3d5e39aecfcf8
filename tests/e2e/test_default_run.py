"""End to end on CPU: a short run learns and logs to MLflow; checkpoints load and resume exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slime_hydra.app.preflight import compose_run
from slime_hydra.app.session import run_session
from tests.support.learning import report
from tests.support.runs import FAST, mlflow_db, run_cli

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`

PERF = "perf/"


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory):
    """A short version of the embedded default through the real CLI, tracked in a sqlite MLflow store."""
    work = tmp_path_factory.mktemp("e2e")
    db = mlflow_db(work / "mlflow.db")
    args = ["logger.progress_bar=false", "num_rollout=100", "eval.eval_interval=50",
            f"logger.tracking_uri={db}", f"hydra.run.dir={work}/run", "save_interval=50"]
    proc = run_cli(args, work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, db, proc


def test_short_run_raises_reward_and_accuracy(learned_run):
    work, _, proc = learned_run
    summary = json.loads((work / "run" / "summary.json").read_text())
    acc = summary["eval/addition/accuracy"]
    report("default_run", eval_first=acc["first"], eval_last=acc["last"], eval_rise=acc["last"] - acc["first"])
    assert acc["count"] == 3  # before the first rollout, after 50 and after 100
    assert acc["first"] <= 0.5, acc  # the warm start leaves the work to RL (<= 0.5 at the first eval, so the rise is RL's)
    assert acc["last"] >= acc["first"] + 0.1, acc
    assert "eval/addition/accuracy" in proc.stdout  # the summary table


def test_weights_changed_and_checkpoint_loads_with_from_pretrained(learned_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_hydra.models.build import build_model, build_tokenizer

    work, _, _ = learned_run
    root = work / "run" / "checkpoints"
    assert (root / "latest").read_text().strip() == "rollout_000099"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "rollout_000049", "rollout_000099"]
    ckpt = root / "rollout_000099"
    trained = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok("12+34=")["input_ids"] == build_tokenizer(compose_run([]).model)("12+34=")["input_ids"]
    init = build_model(compose_run([]).model, tok, seed=1234)
    diffs = [(p - q).abs().max().item() for p, q in zip(trained.parameters(), init.parameters())]
    assert min(diffs) > 0, "every parameter tensor should have moved"


def test_mlflow_run_has_params_metrics_tags_artifacts(learned_run):
    from mlflow.tracking import MlflowClient

    work, db, _ = learned_run
    client = MlflowClient(tracking_uri=db)
    (run,) = client.search_runs([client.get_experiment_by_name("slime_hydra").experiment_id])
    assert run.info.status == "FINISHED"
    p = run.data.params
    assert p["rollout.rollout_batch_size"] == "32" and p["algorithm.advantage_estimator"] == "grpo"
    assert p["train.global_batch_size"] == "256"  # derived values are logged, not the nulls
    for key in ("rollout/reward_mean", "rollout/response_len_mean", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl",
                "train/entropy", "train/grad_norm", "eval/addition/accuracy", "perf/rollout_time_s", "perf/train_time_s",
                "perf/tokens_per_s"):
        assert key in run.data.metrics, key
    history = client.get_metric_history(run.info.run_id, "rollout/reward_mean")
    assert sorted(m.step for m in history) == list(range(1, 101))
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/addition/accuracy")] == [0, 50, 100]
    assert run.data.tags["experiment_name"] == "grpo/qwen3-tiny-addition-cpu-local-torch-v4"
    assert "num_rollout=100" in run.data.tags["overrides"] and len(run.data.tags["git_sha"]) >= 7
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"composed_config.yaml", "reward_curve.png", "summary.json"} <= artifacts


def run_in_process(tmp: Path, name: str, extra: list[str]) -> list[tuple[int, dict]]:
    cfg = compose_run(FAST + ["logger=none", "seed=5", *extra])
    out = tmp / name
    run_session(cfg, str(out), extra)
    return json.loads((out / "summary.json").read_text()), out


def test_resume_continues_the_same_metric_sequence(tmp_path):
    from slime_hydra.engine.checkpoint import load_state

    # the uninterrupted run also leaves the checkpoint after rollout 3 that an interrupted one would have
    _, full = run_in_process(tmp_path, "full", ["num_rollout=6", "save_interval=3"])
    _, resumed = run_in_process(tmp_path, "resumed", ["num_rollout=6", f"load={full}/checkpoints/rollout_000002"])
    h_full = load_state(full / "checkpoints" / "rollout_000005")["history"]
    h_res = load_state(resumed / "checkpoints" / "rollout_000005")["history"]
    assert [s for s, _ in h_res] == [0, 1, 2, 3, 4, 5, 6]  # eval before training is step 0
    for (s, a), (_, b) in zip(h_full, h_res):
        keys = [k for k in a if not k.startswith(PERF)]
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, f"rollout {s} differs after resume"
    w_full = load_state(full / "checkpoints" / "rollout_000005")["trainer"]["optimizer"]
    w_res = load_state(resumed / "checkpoints" / "rollout_000005")["trainer"]["optimizer"]
    for i in w_full["state"]:
        assert torch.equal(w_full["state"][i]["exp_avg"], w_res["state"][i]["exp_avg"])


def test_tensorboard_logger_writes_events(tmp_path):
    cfg = compose_run(FAST + ["logger=tensorboard", "num_rollout=1"])
    run_session(cfg, str(tmp_path / "tb"), [])
    assert list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))
