"""Loads slime-format prompt files (jsonl, parquet, a Hugging Face dataset): one object per row with an input and a label.

Every row is checked as it loads (rows.py); every problem names the file, the line and the key to fix.
Chat-list prompts are rendered with the tokenizer's chat template when `apply_chat_template` is on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from slime_hydra.config.datafiles import resolve
from slime_hydra.data.rows import MAX_LINE_BYTES, RowKeys, read_rows
from slime_hydra.errors import DataError

log = logging.getLogger(__name__)


@dataclass
class Prompt:
    prompt: Any  # as in the file: str or a chat list
    text: str  # what the model sees (chat template applied)
    tokens: list[int]
    label: Optional[str]
    metadata: dict = field(default_factory=dict)


class PromptList(list):
    """The prompts of one file; a plain list to every reader, which also carries how many bad rows
    data.on_bad_row=skip dropped and how many prompts were over the length limit (logged as metrics)."""

    skipped_rows: int = 0
    overlong_rows: int = 0


def render_text(row: dict, tokenizer, apply_chat_template: bool, path: str, input_key: str,
                template_kwargs: Optional[Mapping[str, Any]] = None) -> str:
    """What the model sees of a checked row: the chat template applied (tools listed, data.apply_chat_template_kwargs
    given to it), or the string as it is."""
    raw = row["prompt"]
    if apply_chat_template:
        messages = raw if isinstance(raw, list) else [{"role": "user", "content": raw}]
        tools = {"tools": row["tools"]} if row["tools"] else {}  # data.tool_key: the template lists the tools
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **tools,
                                             **(template_kwargs or {}))
    if isinstance(raw, list):
        raise DataError(f"{path}:{row['line']}: {input_key!r} is a chat list of messages, which needs the chat "
                        "template; set data.apply_chat_template=true")
    return raw


def to_prompt(row: dict, text: str, tokens: list[int]) -> Prompt:
    return Prompt(row["prompt"], text, tokens, None if row["label"] is None else str(row["label"]), row["metadata"])


def load_prompts(
    path: str,
    tokenizer,
    input_key: str,
    label_key: Optional[str],
    metadata_key: str = "metadata",
    apply_chat_template: bool = False,
    max_prompt_len: Optional[int] = None,
    what: str = "data.prompt_data",
    tool_key: Optional[str] = None,
    on_bad_row: str = "error",
    key_prefix: str = "data",
    generate_hooks: frozenset[str] = frozenset(),
    max_line_bytes: int = MAX_LINE_BYTES,
    template_kwargs: Optional[Mapping[str, Any]] = None,
) -> PromptList:
    """Checked, rendered and tokenized prompts; key_prefix names the config group of input_key/label_key,
    generate_hooks the names a row's metadata.custom_generate may take.

    `path` is any data.prompt_data spec (config/datafiles.py): its files are read in order, each checked
    as one file."""
    keys = RowKeys(input_key, label_key, metadata_key, tool_key, key_prefix, frozenset(generate_hooks))
    files, problems = resolve(path, what)
    if problems:
        raise DataError("; ".join(problems))
    prompts = PromptList()
    for f in files:
        read = read_rows(f.path, keys, what, on_bad_row, None if f.kind in ("jsonl", "parquet") else iter_dataset,
                         max_line_bytes)
        prompts.skipped_rows += len(read.skipped)
        for row in read.rows:
            text = render_text(row, tokenizer, apply_chat_template, f.path, input_key, template_kwargs)
            tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
            if max_prompt_len is not None and len(tokens) > max_prompt_len:
                prompts.overlong_rows += 1
                continue
            prompts.append(to_prompt(row, text, tokens))
    if not prompts:
        raise DataError(f"{what}: every prompt in {path} is longer than data.rollout_max_prompt_len={max_prompt_len}")
    if prompts.overlong_rows:
        log.warning("%s: dropped %d prompts longer than %d tokens (data.rollout_max_prompt_len; counted in "
                    "data/overlong_rows)", what, prompts.overlong_rows, max_prompt_len)
    return prompts


def open_dataset(path: str):
    """A Hugging Face dataset directory (save_to_disk) or .arrow file, memory-mapped: rows are read on access."""
    import datasets  # lazy: an optional dependency, needed only for these sources

    if Path(path).is_dir():
        return datasets.load_from_disk(path, keep_in_memory=False)
    return datasets.Dataset.from_file(path, in_memory=False)


def iter_dataset(path: str) -> Iterator[tuple[int, Any, Optional[str]]]:
    """(row number, row, None) of a Hugging Face dataset, 1-based as in rows.py."""
    ds = open_dataset(path)
    for start in range(0, len(ds), 4096):
        for i, row in enumerate(columns_to_rows(ds[start:start + 4096]), start=start + 1):
            yield i, row, None


def columns_to_rows(columns: dict[str, list]) -> list[dict]:
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*(columns[n] for n in names))]
