"""Only finite numbers reach the weights: a run whose reward hook returns NaN, inf or a string, and a run with a NaN
gradient, end with finite weights; a skipped step's checkpoint equals the one before it (training/optim.py,
rewards/compute.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from slime_hydra.app.preflight import compose_run
from slime_hydra.app.session import run_session
from slime_hydra.engine.checkpoint import load_state
from slime_hydra.errors import RunError
from tests.support import plugins
from tests.support.runs import FAST

pytestmark = pytest.mark.integration  # whole runs

BAD_REWARD = "+reward.custom_rm={_target_:tests.support.plugins.invalid_reward,bad:'%s',from_version:%d}"


def run(tmp_path, name: str, extra: list[str]):
    out = tmp_path / name
    history = run_session(compose_run(FAST + ["logger=none", "eval=none", "save_interval=1", *extra]), str(out), extra)
    return out / "checkpoints", history


def weights(ckpt) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model.safetensors"))


def finite(ckpt) -> bool:
    return all(torch.isfinite(t).all() for t in weights(ckpt).values())


@pytest.mark.parametrize("bad", ["nan", "inf", "str"])
def test_invalid_rewards_score_rm_failure_score_and_are_counted(tmp_path, bad):
    root, _ = run(tmp_path, bad, ["num_rollout=2", BAD_REWARD % (bad, 0)])
    history = load_state(root / "rollout_000001")["history"]
    counts = [m["reward/invalid_rewards"] for s, m in history if s > 0]
    assert counts == [8.0, 16.0]  # every 4th of 32 samples per rollout, counted over the run
    assert all(math.isfinite(m["rollout/reward_mean"]) for s, m in history if s > 0)
    assert finite(root / "rollout_000000") and finite(root / "rollout_000001")


def test_invalid_reward_with_rm_on_failure_raise_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    with pytest.raises(RunError, match="gave sample .* the reward nan is not a finite number"):
        run(tmp_path, "raise", ["num_rollout=3", "reward.rm_on_failure=raise", BAD_REWARD % ("nan", 1)])
    root = tmp_path / "raise" / "checkpoints"
    assert (root / "latest").read_text().strip() == "rollout_000000"  # rollout 2 (weights version 1) never trained
    assert sorted(p.name for p in root.glob("rollout_*")) == ["rollout_000000"] and finite(root / "rollout_000000")


def test_a_nan_gradient_skips_its_step_and_the_run_goes_on(tmp_path):
    plugins.NAN_ADVANTAGE_CALLS[0] = 0
    extra = ["num_rollout=4", "+reward.custom_rm={_target_:tests.support.plugins.digit_reward}",
             "+algorithm.custom_advantage={_target_:tests.support.plugins.nan_advantages,nan_at:2}"]
    root, _ = run(tmp_path, "nan_grad", extra)
    history = dict(load_state(root / "rollout_000003")["history"])
    assert [history[s]["train/skipped_steps"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 0.0, 0.0]
    assert math.isnan(history[2]["train/grad_norm"]) and math.isfinite(history[3]["train/grad_norm"])
    good, skipped = weights(root / "rollout_000000"), weights(root / "rollout_000001")
    assert all(torch.equal(good[k], skipped[k]) for k in good)  # the skipped rollout's checkpoint is the last good one
    opt_good = load_state(root / "rollout_000000")["trainer"]["optimizer"]["state"]
    opt_skipped = load_state(root / "rollout_000001")["trainer"]["optimizer"]["state"]
    assert all(torch.equal(opt_good[i][k], opt_skipped[i][k]) for i in opt_good for k in opt_good[i])
    last = weights(root / "rollout_000003")
    assert finite(root / "rollout_000003") and any(not torch.equal(last[k], good[k]) for k in good)  # it trained on
    assert json.loads((tmp_path / "nan_grad" / "summary.json").read_text())["train/skipped_steps"]["max"] == 1.0
