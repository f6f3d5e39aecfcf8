"""slime's rollout hooks through the engine: each runs at its point of a real in-process run (tiny model, local
rollout backend, two rollouts) and its effect reaches what is trained or logged. The plug-ins are
tests/support/rollout_plugins.py, also the examples of docs/customization.md."""

from __future__ import annotations

import json

import pytest
import torch

from slime_hydra.app.preflight import compose_run
from slime_hydra.app.session import run_session
from tests.support import rollout_plugins as P
from tests.support.runs import FAST, problems_of

PLUGINS = "tests.support.rollout_plugins"
# 8 prompts x 4 samples, two rollouts; rewards that differ within a group (digit_reward), no tracker
BASE = FAST + ["logger=none", "num_rollout=2", "+reward.custom_rm._target_=tests.support.plugins.digit_reward"]


def run(tmp_path, *overrides: str) -> dict:
    for recorded in (P.ROLLOUT_CALLS, P.JUDGED, P.BATCHES):
        recorded.clear()
    args = BASE + list(overrides)
    run_session(compose_run(args), str(tmp_path), args)
    return json.loads((tmp_path / "summary.json").read_text())


def test_rollout_function_replaces_generation(tmp_path):
    s = run(tmp_path, f"+rollout.rollout_function._target_={PLUGINS}.one_token_rollout")
    assert P.ROLLOUT_CALLS == [0, 1]  # called once per rollout, with its id
    # every trained response is the function's one token (the built-in collector would give up to 8)
    assert s["rollout/response_len_mean"]["max"] == 1.0 and s["rollout/response_len_mean"]["count"] == 2
    assert s["rollout/one_token_rollouts"]["count"] == 2  # its metrics are logged


def test_generate_hook_returning_three_samples_trains_each_with_its_own_loss_mask(tmp_path):
    run(tmp_path, f"+rollout.custom_generate._target_={PLUGINS}.three_drafts",
        f"+rollout.rollout_all_samples_process._target_={PLUGINS}.record_judged",
        f"+rollout.rollout_data_postprocess._target_={PLUGINS}.scale_advantages")
    for (rollout_id, batch), judged in zip(P.BATCHES, P.JUDGED):
        rows = [s for g in judged for s in g]
        # 8 groups of 4 prompt samples x 3 drafts, in the group right after their prompt sample: draft = row % 3
        assert len(judged) == 8 and all(len(g) == 12 for g in judged) and batch["loss_mask"].shape[0] == 96
        assert [s["draft"] for s in rows] == [0, 1, 2] * 32
        for r, s in enumerate(rows):  # draft i's first i response tokens are out of the loss, the rest in
            R, i = s["response_length"], s["draft"]
            assert s["loss_mask"] == [0] * min(i, R) + [1] * max(R - i, 0)
            assert batch["loss_mask"][r].sum().item() == max(R - i, 0)
        # rewards are centred over the whole group of 12: the per-sample advantages of a group sum to 0
        adv = (batch["advantages"] * batch["loss_mask"]).sum(-1) / batch["loss_mask"].sum(-1).clamp(min=1)
        has = batch["loss_mask"].sum(-1) > 0
        rewards = torch.tensor([s["reward"] for s in rows])
        for g in range(8):
            sl = slice(12 * g, 12 * g + 12)
            mean, std = rewards[sl].mean(), rewards[sl].std()
            expected = (rewards[sl] - mean) / (std + 1e-6)
            assert torch.allclose(adv[sl][has[sl]], expected[has[sl]], atol=1e-4), (rollout_id, g)
    assert [r for r, _ in P.BATCHES] == [0, 1]


def test_sample_filter_removes_samples_from_the_loss(tmp_path):
    run(tmp_path, f"+rollout.rollout_sample_filter._target_={PLUGINS}.remove_below",
        "+rollout.rollout_sample_filter.min_reward=1.0",
        f"+rollout.rollout_all_samples_process._target_={PLUGINS}.record_judged",
        f"+rollout.rollout_data_postprocess._target_={PLUGINS}.scale_advantages")
    for (_, batch), judged in zip(P.BATCHES, P.JUDGED):
        rows = [s for g in judged for s in g]
        kept = batch["loss_mask"].sum(-1) > 0  # [32]
        assert [s["removed"] for s in rows] == [s["reward"] < 1.0 for s in rows]  # the filter ran on every kept sample
        assert kept.tolist() == [not s["removed"] for s in rows]  # removed ones train nothing, the others do
        assert 0 < kept.sum() < 32


def test_all_samples_process_sees_the_groups_dynamic_sampling_dropped(tmp_path):
    s = run(tmp_path, f"+rollout.rollout_all_samples_process._target_={PLUGINS}.record_judged",
            "+rollout.dynamic_sampling_filter._target_=slime_hydra.data.buffer.check_reward_nonzero_std",
            "rollout.over_sampling_batch_size=16")
    dropped = s["rollout/dynamic_sampling_dropped"]
    assert [len(j) for j in P.JUDGED] == [8 + dropped["first"], 8 + dropped["last"]]
    assert dropped["max"] > 0  # some group of four agreed (the untrained model's digits), judged and dropped


def test_convert_samples_to_train_data_decides_what_trains(tmp_path):
    run(tmp_path, f"+rollout.custom_convert_samples_to_train_data._target_={PLUGINS}.first_tokens_only",
        f"+rollout.rollout_all_samples_process._target_={PLUGINS}.record_judged",
        f"+rollout.rollout_data_postprocess._target_={PLUGINS}.scale_advantages")
    for (_, batch), judged in zip(P.BATCHES, P.JUDGED):
        lengths = [s["response_length"] for g in judged for s in g]
        assert batch["loss_mask"].sum(-1).tolist() == [float(min(2, n)) for n in lengths]


@pytest.mark.parametrize("factor", [0.0, 1.0])
def test_rollout_data_postprocess_changes_the_batch_that_trains(tmp_path, factor):
    s = run(tmp_path, f"+rollout.rollout_data_postprocess._target_={PLUGINS}.scale_advantages",
            f"+rollout.rollout_data_postprocess.factor={factor}")
    assert [r for r, _ in P.BATCHES] == [0, 1]
    # zero advantages: no policy gradient (GRPO here has no KL or entropy term), so the gradient norm is 0 exactly
    grad = s["train/grad_norm"]
    assert (grad["max"] == 0.0) if factor == 0.0 else (grad["first"] > 0.0)


def test_a_rollout_function_refuses_the_collector_keys_it_replaces():
    problems = problems_of([f"+rollout.rollout_function._target_={PLUGINS}.one_token_rollout", "rollout.partial_rollout=true",
                            "+rollout.dynamic_sampling_filter._target_=slime_hydra.data.buffer.check_reward_nonzero_std",
                            "rollout.over_sampling_batch_size=64"])
    for key in ("dynamic_sampling_filter", "partial_rollout", "over_sampling_batch_size"):
        assert any(p.startswith(f"rollout.{key}=") and "rollout.rollout_function replaces" in p for p in problems), key
