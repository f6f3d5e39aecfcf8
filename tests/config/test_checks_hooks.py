"""slime's step hooks are checked before launch: each `_target_` imports and binds its step's call, and a hook the chosen
backend never calls is refused by name."""

from __future__ import annotations

from slime_hydra.app.preflight import compose_run
from slime_hydra.config.checks_hooks import STEP_HOOKS
from tests.support.runs import problems_of

# the hooks of the right signature (tests/support/step_hooks.py), by the settings their steps need
GOOD = {
    ("algorithm.use_tis=true",): {
        "algorithm.custom_tis_function": "rejection_tis", "algorithm.custom_pg_loss_reducer_function": "constant_sum_reducer",
        "reward.custom_reward_post_process": "rank_rewards", "logger.custom_rollout_log_function": "log_best_reward",
        "logger.custom_eval_rollout_log_function": "log_eval_sizes", "data.data_source": "AdditionSource",
        "eval.eval_function": "greedy_eval"},
    ("train=megatron",): {
        "train.custom_megatron_init": "record_init", "train.custom_megatron_before_log_prob_hook": "record_log_prob_pass",
        "train.custom_megatron_before_train_step_hook": "record_train_step"},
    ("experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1", "rollout.weight_sync=disk"): {
        "rollout.custom_update_weight_post_write": "record_post_write"},
}
PATH_KWARG = {"record_init", "record_log_prob_pass", "record_train_step", "record_post_write"}  # their node's `path` key


def test_every_step_hook_of_the_right_signature_passes():
    assert {k for hooks in GOOD.values() for k in hooks} == set(STEP_HOOKS)
    for settings, hooks in GOOD.items():
        nodes = [f"++{key}={{_target_:tests.support.step_hooks.{name}{',path:x' if name in PATH_KWARG else ''}}}"
                 for key, name in hooks.items()]
        cfg = compose_run([*settings, *nodes])
        for key, name in hooks.items():
            group, field = key.split(".")
            assert getattr(getattr(cfg, group), field)["_target_"] == f"tests.support.step_hooks.{name}"


def test_a_wrong_path_and_a_wrong_signature_are_named_for_every_hook():
    """One validation names all 11 bad paths; another all 11 signatures that cannot take their step's call (a one-argument
    function: no hook here takes exactly one, or none)."""
    bad_paths = problems_of([f"++{key}._target_=tests.support.step_hooks.no_such_hook" for key in STEP_HOOKS])
    for key in STEP_HOOKS:
        assert any(p.startswith(f"{key}._target_=tests.support.step_hooks.no_such_hook does not import") for p in bad_paths), key
    bad_calls = problems_of([f"++{key}._target_=tests.support.plugins.digit_reward" for key in STEP_HOOKS])
    for key, args in STEP_HOOKS.items():
        call = f"fn({', '.join([*args, '**the node keys'])})"
        assert any(p.startswith(f"{key}._target_=tests.support.plugins.digit_reward: signature") and p.endswith(call)
                   for p in bad_calls), (key, bad_calls)


def test_hooks_that_would_never_run_are_refused_by_name():
    probs = problems_of(["++algorithm.custom_tis_function._target_=tests.support.step_hooks.rejection_tis",
                         "++data.data_source._target_=tests.support.step_hooks.AdditionSource", "data.streaming=true",
                         "++train.custom_megatron_init={_target_:tests.support.step_hooks.record_init,path:x}",
                         "++rollout.custom_update_weight_post_write={_target_:tests.support.step_hooks.record_post_write,path:x}"])
    assert any(p.startswith("algorithm.custom_tis_function replaces TIS's weights and runs only with algorithm.use_tis=true")
               for p in probs), probs
    assert any(p.startswith("data.data_source serves the prompts itself") for p in probs), probs
    assert any(p.startswith("train.custom_megatron_init apply only with train.backend=megatron (train.backend=torch)")
               for p in probs), probs
    assert any(p.startswith("rollout.custom_update_weight_post_write runs after a disk weight sync writes its files; this "
                            "run syncs in memory (rollout.backend=local") for p in probs), probs


def test_an_eval_function_must_be_async_and_a_source_class_a_prompt_source():
    probs = problems_of(["++eval.eval_function._target_=tests.support.plugins.sync_eval",
                         "++data.data_source._target_=tests.support.plugins.GroupsOnlySource"])
    assert sorted(probs) == ["data.data_source._target_=tests.support.plugins.GroupsOnlySource lacks metrics, state_dict, "
                             "load_state_dict: a prompt source has next_groups, metrics, state_dict, load_state_dict "
                             "(protocols.PromptSource)",
                             "eval.eval_function._target_=tests.support.plugins.sync_eval must be an `async def` function (it "
                             "awaits the rollout backend's generate)"], probs
