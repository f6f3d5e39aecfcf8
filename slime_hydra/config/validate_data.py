"""Validation of the data keys at scale: data.streaming, data.shuffle_buffer_size, data.num_workers,
data.worker_timeout_s, and data.prompt_data as a glob, a directory or a Hugging Face dataset
(config/datafiles.py). What streaming cannot do yet is refused here, naming the key to change.
"""

from __future__ import annotations

from pathlib import Path

from slime_hydra.config.datafiles import resolve
from slime_hydra.config.schema import RunConfig


def check_prompt_data(cfg: RunConfig, problems: list[str]) -> None:
    d = cfg.data
    if not d.prompt_data:
        problems.append(f"data.prompt_data is not set; set it to a jsonl file of {{\"{d.input_key}\": ..., "
                        f"\"{d.label_key}\": ...}} lines")
        return
    files, found = resolve(d.prompt_data)
    problems += found
    for f in files:  # `any` stops at the first non-blank line: a large file is not read here
        if f.kind != "hf" and (Path(f.path).stat().st_size == 0 or (
                f.kind == "jsonl" and not any(line.strip() for line in open(f.path, "rb")))):
            problems.append(f"data.prompt_data={f.path}: the file is empty; it needs one JSON object per line")


def check_streaming(cfg: RunConfig, problems: list[str]) -> None:
    d = cfg.data
    if d.shuffle_buffer_size < 1:
        problems.append(f"data.shuffle_buffer_size={d.shuffle_buffer_size} must be >= 1 (prompts held for the shuffle); "
                        "set data.shuffle_buffer_size=10000, or rollout.rollout_shuffle=false to serve file order")
    if d.num_workers < 0:
        problems.append(f"data.num_workers={d.num_workers} must be >= 0 (0: read in the driver)")
    if d.worker_timeout_s <= 0:
        problems.append(f"data.worker_timeout_s={d.worker_timeout_s} must be > 0 (seconds)")
    if d.num_workers > 0 and not d.streaming:
        problems.append(f"data.num_workers={d.num_workers} reads ahead of the rollout, which only the streaming source "
                        "does (in-memory data is read once, at start); set data.streaming=true or data.num_workers=0")
    if not d.streaming:
        return
    refused = {
        "cluster.backend=ray": (cfg.cluster.backend == "ray",
                                "the rollout manager owns an in-memory source there; set cluster.backend=local or data.streaming=false"),
    }
    for what, (bad, fix) in refused.items():
        if bad:
            problems.append(f"data.streaming=true does not support {what}: {fix}")
