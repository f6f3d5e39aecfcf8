"""Checks of the data keys: data.prompt_data as a file, a glob, a directory or a Hugging Face dataset
(config/datafiles.py), the eval sets' files, data.max_line_bytes, and the keys of reading at scale (data.streaming,
data.shuffle_buffer_size, data.num_workers, data.worker_timeout_s). What a cluster backend cannot stream is refused
beside it (orchestration/checks.py); the prompt length against the model's context is the composition floor's
(app/derive.py, app/checks.py). A file is tested for content a chunk at a time, never a line whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from slime_hydra.config.datafiles import blank_file, eval_datasets, resolve
from slime_hydra.config.schema import RunConfig
from slime_hydra.errors import Missing


def check_data(cfg: RunConfig, problems: list[str]) -> None:
    def one(key: str, path: Optional[str]) -> None:
        if not path:
            problems.append(f"{key} is not set; set it to a jsonl file of {{\"{cfg.data.input_key}\": ..., \"{cfg.data.label_key}\": ...}} lines")
        elif not Path(path).is_file():
            problems.append(Missing(f"{key}={path}: file not found; set {key} to an existing jsonl file", key, path))
        elif Path(path).stat().st_size == 0 or (not path.endswith(".parquet") and blank_file(path)):
            problems.append(f"{key}={path}: the file is empty; it needs one JSON object per line")

    check_prompt_data(cfg, problems)  # a glob, a directory, a Hugging Face dataset too
    check_streaming(cfg, problems)
    if cfg.data.apply_chat_template_kwargs and not cfg.data.apply_chat_template:
        problems.append(f"data.apply_chat_template_kwargs={dict(cfg.data.apply_chat_template_kwargs)} is given to the chat "
                        "template, which is off; set data.apply_chat_template=true or data.apply_chat_template_kwargs={}")
    for name, ds in eval_datasets(cfg, problems).items():
        one(f"eval.eval_prompt_data.{name}" + ("" if isinstance(cfg.eval.eval_prompt_data[name], str) else ".path"), ds.path)


def check_prompt_data(cfg: RunConfig, problems: list[str]) -> None:
    d = cfg.data
    if not d.prompt_data:
        problems.append(f"data.prompt_data is not set; set it to a jsonl file of {{\"{d.input_key}\": ..., "
                        f"\"{d.label_key}\": ...}} lines")
        return
    files, found = resolve(d.prompt_data)
    problems += found
    for f in files:
        if f.kind != "hf" and (Path(f.path).stat().st_size == 0 or (f.kind == "jsonl" and blank_file(f.path))):
            problems.append(f"data.prompt_data={f.path}: the file is empty; it needs one JSON object per line")
    if d.max_line_bytes < 1:
        problems.append(f"data.max_line_bytes={d.max_line_bytes} must be >= 1 (bytes)")


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
