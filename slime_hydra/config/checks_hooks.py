"""The step hooks (slime's customisation paths) checked before launch: each `_target_` node imports, and its signature
binds the call its step makes, positional arguments first, then the node's own keys (config/plugins.py).

Which backend a hook needs (the train ranks' hooks, the disk weight sync's) is checked beside that backend; here only
the config itself: the call, an async eval function, a TIS function without TIS, a data source with streamed data.
The generate hooks and filters are checked where they are read (agent/hook.py, checks_buffer.py).
"""

from __future__ import annotations

import inspect

from slime_hydra.config.plugins import check_target, import_target
from slime_hydra.config.schema import RunConfig

# key -> the call its step makes (positional arguments; the node's keys follow as keywords)
STEP_HOOKS: dict[str, tuple[str, ...]] = {
    "algorithm.custom_tis_function": ("pg_loss", "old_log_probs", "rollout_log_probs", "mask"),
    "algorithm.custom_pg_loss_reducer_function": ("pg_loss", "mask", "denom"),
    "reward.custom_reward_post_process": ("samples", "group_size"),
    "logger.custom_rollout_log_function": ("rollout_id", "samples", "metrics", "rollout_time"),
    "logger.custom_eval_rollout_log_function": ("step", "samples", "metrics"),
    "data.data_source": ("prompts", "tokenizer", "n_samples_per_prompt", "seed"),
    "eval.eval_function": ("step", "rollout", "prompts", "n_samples", "sampling"),
    "train.custom_megatron_init": (),
    "train.custom_megatron_before_log_prob_hook": ("model", "store_prefix"),
    "train.custom_megatron_before_train_step_hook": ("rollout_id", "step_id", "model", "optimizer"),
    "rollout.custom_update_weight_post_write": ("version_dir", "version"),
}
SOURCE_METHODS = ("next_groups", "metrics", "state_dict", "load_state_dict")  # protocols.PromptSource


def node_of(cfg: RunConfig, key: str) -> dict:
    group, name = key.split(".")
    return getattr(getattr(cfg, group), name)


def check_step_hooks(cfg: RunConfig, problems: list[str]) -> None:
    for key, args in STEP_HOOKS.items():
        found: list[str] = []
        check_target(key, node_of(cfg, key), len(args), found)
        call = f"fn({', '.join([*args, '**the node keys'])})"
        problems += [f"{p}; its step calls {call}" if "signature" in p else p for p in found]
    a, d = cfg.algorithm, cfg.data
    if a.custom_tis_function and not a.use_tis:
        problems.append("algorithm.custom_tis_function replaces TIS's weights and runs only with algorithm.use_tis=true; "
                        "set algorithm.use_tis=true, or unset algorithm.custom_tis_function")
    if d.data_source and d.streaming:
        problems.append("data.data_source serves the prompts itself: data.streaming=true would stream prompt_data beside "
                        "it; set data.streaming=false, or unset data.data_source")
    if d.data_source:
        fn = import_target("data.data_source", d.data_source, [])
        missing = [m for m in SOURCE_METHODS if inspect.isclass(fn) and not callable(getattr(fn, m, None))]
        if missing:
            problems.append(f"data.data_source._target_={d.data_source['_target_']} lacks {', '.join(missing)}: a prompt "
                            f"source has {', '.join(SOURCE_METHODS)} (protocols.PromptSource)")
    fn = import_target("eval.eval_function", cfg.eval.eval_function, []) if cfg.eval.eval_function else None
    if fn is not None and not inspect.iscoroutinefunction(fn):
        problems.append(f"eval.eval_function._target_={cfg.eval.eval_function['_target_']} must be an `async def` "
                        "function (it awaits the rollout backend's generate)")
