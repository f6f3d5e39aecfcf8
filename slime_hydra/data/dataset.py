"""Loads slime-format prompt files (jsonl, or parquet): one object per row with an input and a label.

Every row is checked as it loads (rows.py); every problem names the file, the line and the key to fix.
Chat-list prompts are rendered with the tokenizer's chat template when `apply_chat_template` is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from slime_hydra.data.rows import RowKeys, read_rows
from slime_hydra.errors import DataError


@dataclass
class Prompt:
    prompt: Any  # as in the file: str or a chat list
    text: str  # what the model sees (chat template applied)
    tokens: list[int]
    label: Optional[str]
    metadata: dict = field(default_factory=dict)


class PromptList(list):
    """The prompts of one file; a plain list to every reader, which also carries how many bad rows
    data.on_bad_row=skip dropped (logged as a metric)."""

    skipped_rows: int = 0


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
) -> PromptList:
    """Checked, rendered and tokenized prompts; key_prefix names the config group of input_key/label_key."""
    read = read_rows(path, RowKeys(input_key, label_key, metadata_key, tool_key, key_prefix), what, on_bad_row)
    prompts = PromptList()
    prompts.skipped_rows = len(read.skipped)
    for row in read.rows:
        raw = row["prompt"]
        if apply_chat_template:
            messages = raw if isinstance(raw, list) else [{"role": "user", "content": raw}]
            tools = {"tools": row["tools"]} if row["tools"] else {}  # data.tool_key: the template lists the tools
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **tools)
        elif isinstance(raw, list):
            raise DataError(f"{path}:{row['line']}: {input_key!r} is a chat list of messages, which needs the chat "
                            "template; set data.apply_chat_template=true")
        else:
            text = raw
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        if max_prompt_len is not None and len(tokens) > max_prompt_len:
            continue
        label = None if row["label"] is None else str(row["label"])
        prompts.append(Prompt(raw, text, tokens, label, row["metadata"]))
    if not prompts:
        raise DataError(f"{what}: every prompt in {path} is longer than data.rollout_max_prompt_len={max_prompt_len}")
    return prompts
