"""The SFT warm start: its stopping rule, its accuracy check, and where it lands across seeds."""

from __future__ import annotations

import dataclasses

import pytest

from slime_hydra.app.build import build
from slime_hydra.app.preflight import compose_run
from slime_hydra.app.session import loop_settings
from slime_hydra.config.schema import RewardConfig
from slime_hydra.engine.loop import prepare
from slime_hydra.engine.steps import EvalSet, evaluate, generate_groups
from slime_hydra.engine.warmstart import accuracy_check, warm_start
from slime_hydra.rewards.compute import RewardScorer
from slime_hydra.rollout.local import LocalRollout
from tests.support.runs import FAST, problems_of


@pytest.fixture
def components(tmp_path):
    cfg = compose_run(FAST + ["logger=none", "num_rollout=1"])
    c = build(cfg, str(tmp_path))
    yield cfg, c
    c.rollout.shutdown()


def test_stops_at_the_first_check_that_reaches_the_target(components):
    cfg, c = components
    scripted = iter([0.1, 0.2, 0.45, 0.9])
    calls = []

    def check():
        calls.append(len(calls))
        return next(scripted)

    res = warm_start(c.trainer, c.train_prompts, c.tokenizer, steps=40, batch_size=8, lr=1e-3, seed=0, check=check,
                     check_interval=5, target=0.4)
    assert (res.steps, res.train_accuracy, len(calls)) == (15, 0.45, 3)  # checks after steps 5, 10, 15


def test_min_steps_puts_a_floor_under_the_stop(components):
    cfg, c = components
    calls = []

    def check():  # would stop at the very first check
        calls.append(len(calls))
        return 0.9

    res = warm_start(c.trainer, c.train_prompts, c.tokenizer, steps=40, batch_size=8, lr=1e-3, seed=0, check=check,
                     check_interval=5, target=0.4, min_steps=12)
    assert (res.steps, res.train_accuracy, len(calls)) == (15, 0.9, 1)  # no check after 5 or 10; the first after 15


def test_takes_every_step_without_a_target_or_when_it_is_never_reached(components):
    cfg, c = components
    res = warm_start(c.trainer, c.train_prompts, c.tokenizer, steps=7, batch_size=8, lr=1e-3, seed=0,
                     check=lambda: pytest.fail("no target: no check"))
    assert (res.steps, res.train_accuracy) == (7, None)
    res = warm_start(c.trainer, c.train_prompts, c.tokenizer, steps=7, batch_size=8, lr=1e-3, seed=0,
                     check=lambda: 0.25, check_interval=3, target=0.3)
    assert (res.steps, res.train_accuracy) == (7, 0.25)  # checked after 3 and 6, then the cap


def test_accuracy_check_scores_the_trainers_current_weights_greedily(components):
    """Labels made from the trainer's own greedy answers (half of them spoiled): the check must read 0.5, which it
    only can after syncing the trainer's weights to the rollout (the rollout still holds the initial ones)."""
    cfg, c = components
    warm_start(c.trainer, c.train_prompts, c.tokenizer, steps=30, batch_size=32, lr=3e-3, seed=0)  # weights move
    prompts = c.train_prompts[:8]
    greedy = dataclasses.replace(c.sampling, top_k=1)
    own = LocalRollout(c.trainer.model, c.tokenizer, seed=0)
    exact = RewardScorer(RewardConfig(rm_type="exact_match"))
    answers = [s.response for s in generate_groups(own, prompts, 1, greedy)]
    relabelled = [dataclasses.replace(p, label=a if i % 2 == 0 else a + "#") for i, (p, a) in enumerate(zip(prompts, answers))]
    before = evaluate(c.rollout, {"x": EvalSet(relabelled, greedy, 1, exact)}, 0)[0]["eval/x/accuracy"]
    assert before != 0.5  # the rollout's initial weights answer differently
    check = accuracy_check(c.trainer, c.rollout, relabelled, exact, c.sampling)  # c.sampling samples at temperature 1
    assert check() == 0.5


@pytest.mark.integration
def test_target_lands_in_a_band_where_a_fixed_step_count_does_not(tmp_path):
    """Seed 1237: v3's 300 fixed SFT steps land at held-out 0.045 (docs/cpu_results.md); with a target of 0.3 on
    training prompts alone (no floor, whatever the default experiment sets) the warm start hands over in the band
    that leaves RL the work (<= 0.5)."""
    cfg = compose_run(["logger=none", "seed=1237", "warmstart.steps=1000", "warmstart.target_train_accuracy=0.3",
                       "warmstart.min_steps=0"])
    c = build(cfg, str(tmp_path))
    logged = []
    c.tracker.log_metrics = lambda m, step: logged.append(m)
    prepare(loop_settings(cfg), c)
    c.rollout.shutdown()
    w, heldout = logged[0], c.state.history[0][1]["eval/addition/accuracy"]
    assert w["warmstart/train_accuracy"] >= 0.3 and w["warmstart/steps"] % 5 == 0 and w["warmstart/steps"] < 1000, w
    assert 0.2 <= heldout <= 0.5, heldout


def test_bad_warm_start_keys_are_config_errors():
    text = "\n".join(problems_of(["warmstart.target_train_accuracy=1.5", "warmstart.check_interval=0"]))
    assert "warmstart.target_train_accuracy=1.5 must be in (0, 1]" in text
    assert "warmstart.check_interval=0 must be >= 1" in text
    # steps=0 switches the warm start off, target and floor included (e.g. FAST on an experiment that sets both)
    assert compose_run(["warmstart.steps=0", "warmstart.target_train_accuracy=0.3", "warmstart.min_steps=300"]).warmstart.steps == 0
    (msg,) = problems_of(["warmstart.steps=100", "warmstart.target_train_accuracy=null", "warmstart.min_steps=50"])
    assert "set a target or warmstart.min_steps=0" in msg
    (msg,) = problems_of(["warmstart.steps=100", "warmstart.target_train_accuracy=0.3", "warmstart.min_steps=150"])
    assert "warmstart.min_steps=150 must be in [0, warmstart.steps=100]" in msg

