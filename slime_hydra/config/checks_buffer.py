"""Checks of the data buffer, dynamic sampling, partial rollout, the async train mode and the run's length in
epochs (num_epoch, from which derivation counts num_rollout: app/derive.py)."""

from __future__ import annotations

from typing import Optional

from slime_hydra.config.datafiles import count_prompts
from slime_hydra.config.plugins import check_target
from slime_hydra.config.schema import RunConfig


def check_num_epoch(cfg: RunConfig, given_num_rollout: Optional[int], problems: list[str]) -> None:
    """num_epoch: at least one, not beside a num_rollout of the user's, over files whose rows can be counted."""
    if cfg.num_epoch is None:
        return
    if cfg.num_epoch < 1:
        problems.append(f"num_epoch={cfg.num_epoch} must be >= 1 or null")
    elif given_num_rollout is not None:
        problems.append(f"num_rollout={given_num_rollout} and num_epoch={cfg.num_epoch} are both set; set one of them "
                        "(num_rollout=null to derive it from num_epoch)")
    elif cfg.num_rollout is None and cfg.data.prompt_data:  # not derived: say why (a missing file: check_data names it)
        problems += count_prompts(cfg.data.prompt_data, f"num_epoch={cfg.num_epoch}")[1]


def check_buffer(cfg: RunConfig, problems: list[str]) -> None:
    r = cfg.rollout
    if r.over_sampling_batch_size is not None and r.over_sampling_batch_size < 1:
        problems.append(f"rollout.over_sampling_batch_size={r.over_sampling_batch_size} must be >= 1 or null "
                        f"(null: rollout.rollout_batch_size={r.rollout_batch_size})")
    check_target("rollout.dynamic_sampling_filter", r.dynamic_sampling_filter, 1, problems)
    if r.max_dynamic_sampling_rounds < 1:
        problems.append(f"rollout.max_dynamic_sampling_rounds={r.max_dynamic_sampling_rounds} must be >= 1")
    check_target("rollout.buffer_filter", r.buffer_filter, 2, problems)
    if r.mask_offpolicy_in_partial_rollout and not r.partial_rollout:
        problems.append("rollout.mask_offpolicy_in_partial_rollout=true has no effect without rollout.partial_rollout=true; "
                        "set rollout.partial_rollout=true or rollout.mask_offpolicy_in_partial_rollout=false")
    check_async(cfg, problems)


def check_async(cfg: RunConfig, problems: list[str]) -> None:
    for key in ("async_buffer_size", "update_weights_interval"):
        if getattr(cfg, key) < 1:
            problems.append(f"{key}={getattr(cfg, key)} must be >= 1")
    if cfg.async_rollout_timeout_s <= 0:
        problems.append(f"async_rollout_timeout_s={cfg.async_rollout_timeout_s} must be > 0 (seconds)")
    if cfg.async_buffer_size != 1 and cfg.train_mode != "async":
        problems.append(f"async_buffer_size={cfg.async_buffer_size} has no effect with train_mode={cfg.train_mode}; "
                        "set train_mode=async or async_buffer_size=1")
