"""The engine's step hooks at their points: reward.custom_reward_post_process between rewards and advantages,
eval.eval_function and logger.custom_eval_rollout_log_function in an eval, a log function's answer on the step's
metrics, and a data.data_source built as the run's prompt source. Numbers worked out by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slime_hydra.app.algorithm import advantage_spec
from slime_hydra.app.preflight import compose_run
from slime_hydra.engine.steps import EvalSet, advantages, evaluate, logged
from slime_hydra.types import Sample

POST = "++reward.custom_reward_post_process._target_=tests.support.step_hooks.rank_rewards"


def scored(rewards: list[float]) -> list[Sample]:
    """One sample per reward: two prompt tokens, two response tokens."""
    return [Sample(prompt="p", tokens=[1, 2, 3, 4], response_length=2, reward=r, group_index=i // 4, index=i)
            for i, r in enumerate(rewards)]


def test_a_reward_post_process_changes_the_rewards_before_advantages():
    """Raw rewards (0, 5, 1, 2 | 4, 4, 0, 9), GRPO centred per group of 4 without std division. Without the hook: group
    means 2 and 4.25 -> (-2, 3, -1, 0 | -0.25, -0.25, -4.25, 4.75). rank_rewards gives the ranks within each group,
    (0, 3, 1, 2 | 1, 2, 0, 3) (ties by order), mean 1.5 -> (-1.5, 1.5, -0.5, 0.5 | -0.5, 0.5, -1.5, 1.5); the samples keep
    their raw rewards."""
    raw = [0.0, 5.0, 1.0, 2.0, 4.0, 4.0, 0.0, 9.0]
    for overrides, want in (([], [-2, 3, -1, 0, -0.25, -0.25, -4.25, 4.75]), ([POST], [-1.5, 1.5, -0.5, 0.5, -0.5, 0.5, -1.5, 1.5])):
        cfg = compose_run(["algorithm.grpo_std_normalization=false", *overrides])
        samples = scored(raw)
        batch = advantages(samples, advantage_spec(cfg.algorithm, cfg.reward.custom_reward_post_process), 4, 0, None)
        assert batch.advantages[:, -1].tolist() == pytest.approx(want) and batch.advantages[:, 0].eq(0).all()
        assert [s.reward for s in samples] == raw


def test_a_log_functions_answer_adds_or_drops_metrics():
    metrics = {"rollout/reward_mean": 0.5, "perf/step_time_s": 1.0}
    assert logged({"custom/x": 2}, metrics, "rollout/") == metrics | {"custom/x": 2.0}
    assert logged(True, metrics, "rollout/") == {"perf/step_time_s": 1.0}  # slime's "skip the default logging"
    assert logged(None, metrics, "rollout/") == logged(False, metrics, "rollout/") == metrics


def test_an_eval_function_and_an_eval_log_function_at_the_eval(tmp_path):
    """greedy_eval decodes each prompt's 4 samples with top_k=1: the eval's sample file holds one response 4 times per
    prompt, where the set's own temperature-1 sampling gives some prompt different ones; the eval log function's metric
    counts the set's 4 x 4 = 16 samples."""
    from slime_hydra.app.inputs import prepare
    from slime_hydra.app.plugins import load_target, reward_scorer
    from slime_hydra.models.build import build_model
    from slime_hydra.rollout.local import LocalRollout

    cfg = compose_run(["++eval.eval_function._target_=tests.support.step_hooks.greedy_eval", "warmstart.steps=0",
                       "++logger.custom_eval_rollout_log_function._target_=tests.support.step_hooks.log_eval_sizes"])
    inputs = prepare(cfg)
    rollout = LocalRollout(build_model(inputs.model, inputs.tokenizer, cfg.seed), inputs.tokenizer, seed=cfg.seed)
    es = inputs.eval_sets["addition"]
    sampling = dataclasses.replace(es.sampling, temperature=1.0, top_k=-1)  # the shipped eval decodes greedily itself
    sets = {"addition": EvalSet(es.prompts[:4], sampling, 4, reward_scorer(cfg.reward))}

    def responses(step: int) -> list[set[str]]:
        rows = [json.loads(line) for line in (tmp_path / "addition" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        return [{r["response"] for r in rows if r["group_index"] == g} for g in range(4)]

    got, _ = evaluate(rollout, sets, 3, tmp_path, generate=load_target(cfg.eval.eval_function),
                      log=load_target(cfg.logger.custom_eval_rollout_log_function))
    assert got["custom/addition_samples"] == 16.0 and [len(r) for r in responses(3)] == [1, 1, 1, 1]
    sampled, _ = evaluate(rollout, sets, 4, tmp_path)
    assert "custom/addition_samples" not in sampled and max(len(r) for r in responses(4)) > 1


def test_a_data_source_serves_its_own_prompts_and_resumes_from_its_state():
    """AdditionSource's groups are single-digit sums of its own (the embedded prompts are two-digit): 4 samples each,
    indexed by the groups served; a copy loaded from its state_dict serves what the original serves next."""
    from slime_hydra.app.inputs import build_source, prepare

    cfg = compose_run(["++data.data_source._target_=tests.support.step_hooks.AdditionSource", "warmstart.steps=0",
                       "rollout.n_samples_per_prompt=4"])
    inputs = prepare(cfg)
    source = build_source(cfg, inputs.tokenizer, inputs.train_prompts)
    first = source.next_groups(3)
    assert [len(g) for g in first] == [4, 4, 4] and [g[0].group_index for g in first] == [0, 1, 2]
    for g in first:
        a, b = g[0].prompt[:-1].split("+")
        assert len(a) == len(b) == 1 and g[0].label == str(int(a) + int(b))
        assert g[0].prompt_tokens == inputs.tokenizer(g[0].prompt, add_special_tokens=False)["input_ids"]
    state = source.state_dict()
    again = build_source(cfg, inputs.tokenizer, inputs.train_prompts)
    again.load_state_dict(state)
    assert [[s.prompt for s in g] for g in again.next_groups(2)] == [[s.prompt for s in g] for g in source.next_groups(2)]
    assert source.metrics() == {"data/custom_groups_served": 5.0}
