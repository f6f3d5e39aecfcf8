"""The data buffer: filter contract, dynamic sampling with hand-built rewards, partial rollout over many rollouts.

Real parts: the embedded tokenizer and an untrained tiny Qwen3 in a real LocalRollout, the real
RewardScorer with a custom `_target_` reward, the real PromptSource over the shipped addition data.
"""

from __future__ import annotations

from collections import Counter

import pytest

from slime_hydra.app.plugins import reward_scorer
from slime_hydra.app.preflight import compose_run
from slime_hydra.config.schema import RewardConfig
from slime_hydra.data.buffer import DataBuffer, check_reward_nonzero_std, fifo_buffer_filter
from slime_hydra.data.dataset import load_prompts
from slime_hydra.data.source import PromptSource
from slime_hydra.engine.collect import RolloutPlan, collect_rollout
from slime_hydra.errors import ConfigError, UserError
from slime_hydra.types import SamplingParams, Status
from tests.support.plugins import newest_first


def group_pattern_reward(sample, **kwargs) -> float:
    """Groups 0, 3, 6, ... score 1 on every sample (rewards agree: DAPO drops them); others alternate 0, 1."""
    return 1.0 if sample.group_index % 3 == 0 else float(sample.index % 2)


def steals_a_group(buffer, num_groups):
    return buffer[:1] + [list(buffer[0])]  # a copy is not a group of the buffer


def one_arg_filter(buffer):
    return buffer


@pytest.fixture(scope="module")
def parts():
    from slime_hydra.models.build import build_model, build_tokenizer

    cfg = compose_run(["logger=none"])
    tok = build_tokenizer(cfg.model)
    prompts = load_prompts(cfg.data.prompt_data, tok, input_key="prompt", label_key="label")
    return tok, build_model(cfg.model, tok, seed=3), prompts


def make(parts, n, gen_batch=256, seed=0):
    from slime_hydra.rollout.local import LocalRollout

    tok, model, prompts = parts
    return LocalRollout(model, tok, seed=seed, generation_batch_size=gen_batch), PromptSource(prompts, n, True, 7)


# -- buffer_filter contract ------------------------------------------------------------------------------------------------

def test_buffer_serves_returned_groups_first_in_filter_order(parts):
    _, source = make(parts, n=2)
    buf = DataBuffer(source)
    first = buf.get_groups(3)  # fresh groups 0, 1, 2
    assert [g[0].group_index for g in first] == [0, 1, 2] and [s.index for s in first[1]] == [2, 3]
    buf.add_groups(first, keep_generation=False)
    assert [g[0].group_index for g in buf.get_groups(2)] == [0, 1]  # FIFO, then the rest stays
    assert [g[0].group_index for g in buf.get_groups(3)] == [2, 3, 4]  # the buffer's last, then fresh ones
    lifo = DataBuffer(make(parts, n=2)[1], newest_first)
    lifo.add_groups(lifo.get_groups(3), keep_generation=False)
    assert [g[0].group_index for g in lifo.get_groups(2)] == [2, 1] and len(lifo) == 1
    assert fifo_buffer_filter([[1], [2]], 1) == [[1]]


def test_buffer_filter_breaking_the_contract_is_named(parts):
    buf = DataBuffer(make(parts, n=2)[1], steals_a_group)
    buf.add_groups(buf.get_groups(2), keep_generation=False)
    with pytest.raises(UserError, match="rollout.buffer_filter returned list of 2 item"):
        buf.get_groups(2)


def test_buffer_filter_signature_checked_at_validation():
    with pytest.raises(ConfigError) as info:
        compose_run(["+rollout.buffer_filter._target_=tests.data.test_buffer.one_arg_filter",
                     "+rollout.dynamic_sampling_filter._target_=tests.data.test_buffer.nope"])
    text = "\n".join(info.value.problems)
    assert "rollout.buffer_filter._target_=tests.data.test_buffer.one_arg_filter: signature (buffer)" in text
    assert "rollout.dynamic_sampling_filter._target_=tests.data.test_buffer.nope does not import" in text


# -- dynamic sampling ------------------------------------------------------------------------------------------------------

def test_dynamic_sampling_fills_the_batch_and_counts_drops(parts):
    rollout, source = make(parts, n=2)
    buf = DataBuffer(source)
    scorer = reward_scorer(RewardConfig(custom_rm={"_target_": "tests.data.test_buffer.group_pattern_reward"}))
    plan = RolloutPlan(rollout_batch_size=4, over_sampling_batch_size=4, dynamic_sampling_filter=check_reward_nonzero_std)
    sp = SamplingParams(max_new_tokens=3)  # no stop token: every sample ends at the same step, groups finish in order
    # rollout 1. round 1 serves groups 0-3: 0 and 3 agree (dropped), 1 and 2 pass. Round 2 serves 4-7: 4 and 5 pass
    # and fill the batch; 6 and 7 are never judged and go back to the buffer (reset: no partial_rollout).
    got = collect_rollout(rollout, buf, scorer, sp, plan)
    assert [s.group_index for s in got.samples[::2]] == [1, 2, 4, 5]
    assert [g[0].group_index for g, _ in got.dropped] == [0, 3]
    m = got.metrics
    assert (m["rollout/dynamic_sampling_rounds"], m["rollout/dynamic_sampling_dropped"]) == (2, 2)
    assert (m["rollout/dynamic_sampling_dropped_zero_std"], m["rollout/returned_groups"], m["rollout/buffer_groups"]) == (2, 2, 2)
    assert all(s.status == Status.PENDING and s.tokens == [] for g in buf.groups for s in g)
    # rollout 2. round 1: 6, 7 from the buffer, then fresh 8, 9: 6 and 9 dropped, 7 and 8 pass. Round 2: 10-13:
    # 10 and 11 fill it; 12 (would be dropped) and 13 return.
    got = collect_rollout(rollout, buf, scorer, sp, plan)
    assert [s.group_index for s in got.samples[::2]] == [7, 8, 10, 11]
    assert [g[0].group_index for g, _ in got.dropped] == [6, 9]
    assert [g[0].group_index for g in buf.groups] == [12, 13]
    assert all(len(set(s.reward for s in got.samples[i : i + 2])) == 2 for i in range(0, 8, 2))


def test_surplus_groups_keep_their_generation_with_partial_rollout(parts):
    rollout, source = make(parts, n=2)
    buf = DataBuffer(source)
    scorer = reward_scorer(RewardConfig(custom_rm={"_target_": "tests.data.test_buffer.group_pattern_reward"}))
    plan = RolloutPlan(4, 4, check_reward_nonzero_std, partial_rollout=True)
    sp = SamplingParams(max_new_tokens=3)
    collect_rollout(rollout, buf, scorer, sp, plan)
    kept_back = {s.index: list(s.tokens) for g in buf.groups for s in g}  # groups 6, 7: finished, never judged
    assert sorted(kept_back) == [12, 13, 14, 15] and all(len(t) > 0 for t in kept_back.values())
    got = collect_rollout(rollout, buf, scorer, sp, plan)
    assert {s.index: s.tokens for s in got.samples if s.index in kept_back} == {14: kept_back[14], 15: kept_back[15]}


def drops_everything(group):
    return False, "never"


def test_a_filter_that_never_keeps_a_group_stops_at_max_rounds_naming_the_keys(parts):
    """Without the bound this rollout would never end; with max_rounds=3 it stops after 3 rounds of 4 groups."""
    from slime_hydra.errors import RunError

    rollout, source = make(parts, n=2)
    buf = DataBuffer(source)
    scorer = reward_scorer(RewardConfig(custom_rm={"_target_": "tests.data.test_buffer.group_pattern_reward"}))
    plan = RolloutPlan(rollout_batch_size=4, over_sampling_batch_size=4, dynamic_sampling_filter=drops_everything,
                       max_rounds=3)
    with pytest.raises(RunError) as e:
        collect_rollout(rollout, buf, scorer, SamplingParams(max_new_tokens=3), plan)
    assert ("dynamic sampling: 0 of rollout.rollout_batch_size=4 groups passed rollout.dynamic_sampling_filter in "
            "rollout.max_dynamic_sampling_rounds=3 rounds of 4 groups (12 dropped: 12 never)") in str(e.value)
    with pytest.raises(ConfigError, match=r"rollout.max_dynamic_sampling_rounds=0 must be >= 1"):
        compose_run(["rollout.max_dynamic_sampling_rounds=0"])


# -- partial rollout -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", [False, True])
def test_partial_rollout_reserves_every_aborted_group_exactly_once(parts, mask):
    """Groups finish at different decode steps (a digit stops a sample), so reaching rollout_batch_size aborts the
    others mid-generation; they come back with their tokens and continue. Over 12 rollouts every group is served
    once plus once per abort, trained at most once, and nothing is lost; a continued response extends its prefix."""
    rollout, source = make(parts, n=4)
    buf = DataBuffer(source)
    served: Counter = Counter()
    get = buf.get_groups
    buf.get_groups = lambda k: [served.update([g[0].group_index]) or g for g in get(k)]  # record every serve
    scorer = reward_scorer(RewardConfig(custom_rm={"_target_": "tests.data.test_buffer.group_pattern_reward"}))
    plan = RolloutPlan(2, 4, None, partial_rollout=True, mask_offpolicy_in_partial_rollout=mask)
    sp = SamplingParams(max_new_tokens=8, stop_token_ids=tuple(range(4, 14)))
    trained: list[int] = []
    returned: Counter = Counter()
    aborted = continued = stale = 0
    prefixes: dict[int, tuple[list[int], int]] = {}  # sample index -> (partial response, version that generated it)
    for version in range(12):
        rollout.update_weights([], version=version)  # as if trained: each rollout's weights are newer
        before = dict(served)
        got = collect_rollout(rollout, buf, scorer, sp, plan)
        assert len(got.samples) == 8 and len(got.dropped) == 0
        trained += [s.group_index for s in got.samples[::4]]
        for s in got.samples:
            assert len(s.rollout_log_probs) == len(s.loss_mask) == s.response_length <= 8
            if s.index in prefixes:
                prefix, v = prefixes.pop(s.index)
                continued, stale = continued + 1, stale + (v < version)
                assert s.response_tokens[: len(prefix)] == prefix and s.weight_version == v
                assert s.loss_mask[: len(prefix)] == [0 if mask and v < version else 1] * len(prefix)
                assert s.loss_mask[len(prefix):] == [1] * (s.response_length - len(prefix))
        served_now = {g for g in served if served[g] > before.get(g, 0)}
        for g in buf.groups:  # the buffer only gains groups served in this rollout: those are its returns
            if g[0].group_index in served_now:
                returned[g[0].group_index] += 1
                aborted += any(s.status == Status.ABORTED for s in g)
            prefixes.update({s.index: (s.response_tokens, s.weight_version) for s in g if s.status == Status.ABORTED})
    print(f"aborted groups {aborted}, continued samples trained {continued}, of them continued by newer weights {stale}")
    assert aborted >= 5 and continued >= 10 and stale >= 5, "the run should abort groups mid-generation and continue them"
    assert len(trained) == len(set(trained)) == 24
    waiting = {g[0].group_index for g in buf.groups}
    assert set(trained) | waiting == set(range(source.next_group_index)) and not set(trained) & waiting
    # served once fresh, then once more after each return; a group still waiting has not been re-served yet
    assert all(served[g] == 1 + returned[g] - (g in waiting) for g in served), (served, returned, waiting)
