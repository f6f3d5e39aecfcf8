"""Validation of the data buffer, dynamic sampling, partial rollout and the async train mode.

Also derives `num_rollout` from `num_epoch` (slime: num_epoch × dataset size // rollout_batch_size,
counting the jsonl's non-empty lines or the parquet's rows; prompts dropped later by
`data.rollout_max_prompt_len` or `data.on_bad_row=skip` still count)
and, in async mode or with partial rollout, turns on the rollout's recorded log-probs as the old
policy, so the importance ratio is taken against the weights that generated each token.
"""

from __future__ import annotations

import dataclasses

from slime_hydra.config.datafiles import resolve
from slime_hydra.config.plugins import check_target
from slime_hydra.config.schema import RunConfig

TRAIN_MODES = ("sync", "async")


def derive_num_rollout(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    if cfg.num_epoch is None:
        return
    if cfg.num_epoch < 1:
        problems.append(f"num_epoch={cfg.num_epoch} must be >= 1 or null")
        return
    if cfg.num_rollout is not None:
        problems.append(f"num_rollout={cfg.num_rollout} and num_epoch={cfg.num_epoch} are both set; set one of them "
                        "(num_rollout=null to derive it from num_epoch)")
        return
    files, missing = resolve(cfg.data.prompt_data) if cfg.data.prompt_data else ([], ["unset"])
    if missing or not files:
        return  # check_data reports the missing file
    if any(f.kind not in ("jsonl", "parquet") for f in files):
        problems.append(f"num_epoch={cfg.num_epoch} needs the row count of data.prompt_data={cfg.data.prompt_data}, "
                        "which is counted for jsonl and parquet files only; set num_rollout instead")
        return
    counts = [count_rows(f.path, problems) for f in files]
    if None in counts:
        return
    n = sum(counts)
    cfg.num_rollout = cfg.num_epoch * n // cfg.rollout.rollout_batch_size
    notes.append(f"num_rollout = num_epoch × prompts // rollout.rollout_batch_size = {cfg.num_epoch} × {n} // "
                 f"{cfg.rollout.rollout_batch_size} = {cfg.num_rollout}")


def count_rows(path: str, problems: list[str]) -> int | None:
    """Rows of a jsonl (non-blank lines, read as bytes: the loader reports bad encodings) or parquet file."""
    if not path.endswith(".parquet"):
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    try:
        import pyarrow.parquet as pq  # lazy: only parquet files need it

        return pq.ParquetFile(path).metadata.num_rows
    except Exception as e:  # noqa: BLE001 - any reader failure is the same fix
        problems.append(f"data.prompt_data={path}: not a readable parquet file ({e}); rewrite it, or give a jsonl file")
        return None


def check_buffer(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    cfg.rollout = r = dataclasses.replace(cfg.rollout)
    if r.over_sampling_batch_size is None:
        r.over_sampling_batch_size = r.rollout_batch_size
    elif r.over_sampling_batch_size < 1:
        problems.append(f"rollout.over_sampling_batch_size={r.over_sampling_batch_size} must be >= 1 or null "
                        f"(null: rollout.rollout_batch_size={r.rollout_batch_size})")
    check_target("rollout.dynamic_sampling_filter", r.dynamic_sampling_filter, 1, problems)
    if r.max_dynamic_sampling_rounds < 1:
        problems.append(f"rollout.max_dynamic_sampling_rounds={r.max_dynamic_sampling_rounds} must be >= 1")
    check_target("rollout.buffer_filter", r.buffer_filter, 2, problems)
    if r.mask_offpolicy_in_partial_rollout and not r.partial_rollout:
        problems.append("rollout.mask_offpolicy_in_partial_rollout=true has no effect without rollout.partial_rollout=true; "
                        "set rollout.partial_rollout=true or rollout.mask_offpolicy_in_partial_rollout=false")
    check_async(cfg, problems, notes)


def check_async(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    if cfg.train_mode not in TRAIN_MODES:
        problems.append(f"train_mode={cfg.train_mode!r} is not one of {list(TRAIN_MODES)}")
    for key in ("async_buffer_size", "update_weights_interval"):
        if getattr(cfg, key) < 1:
            problems.append(f"{key}={getattr(cfg, key)} must be >= 1")
    if cfg.async_rollout_timeout_s <= 0:
        problems.append(f"async_rollout_timeout_s={cfg.async_rollout_timeout_s} must be > 0 (seconds)")
    if cfg.async_buffer_size != 1 and cfg.train_mode != "async":
        problems.append(f"async_buffer_size={cfg.async_buffer_size} has no effect with train_mode={cfg.train_mode}; "
                        "set train_mode=async or async_buffer_size=1")
    a = cfg.algorithm
    stale = cfg.train_mode == "async" or cfg.rollout.partial_rollout or cfg.update_weights_interval > 1
    if stale and not (a.use_rollout_logprobs or a.use_tis):
        cfg.algorithm = dataclasses.replace(a, use_rollout_logprobs=True)
        why = "train_mode=async" if cfg.train_mode == "async" else (
            "rollout.partial_rollout=true" if cfg.rollout.partial_rollout else f"update_weights_interval={cfg.update_weights_interval}")
        notes.append(f"algorithm.use_rollout_logprobs turned on: with {why} samples come from older weights, and the "
                     "importance ratio must use the log-probs of the weights that generated them (or set algorithm.use_tis=true "
                     "to reweight recomputed ones)")
