"""Loads slime-format jsonl prompt files: one JSON object per line with an input and a label.

Every problem names the file, the line and the key to fix. Chat-list prompts are rendered with
the tokenizer's chat template when `apply_chat_template` is on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from slime_hydra.errors import DataError


@dataclass
class Prompt:
    prompt: Any  # as in the file: str or a chat list
    text: str  # what the model sees (chat template applied)
    tokens: list[int]
    label: Optional[str]
    metadata: dict = field(default_factory=dict)


def read_jsonl(path: str, input_key: str, label_key: Optional[str], metadata_key: str, what: str,
               tool_key: Optional[str] = None) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{what}: file not found: {path}; set it to an existing jsonl file")
    rows = []
    with open(p) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno}); fix or remove this line") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
            for key, cfg_key in ((input_key, "input_key"), (label_key, "label_key")):
                if key is not None and key not in row:
                    raise DataError(
                        f"{path}:{lineno}: missing key {key!r} (data.{cfg_key}); keys on this line: "
                        f"{sorted(row)}; set data.{cfg_key} to one of them"
                    )
            rows.append({"prompt": row[input_key], "label": None if label_key is None else row[label_key],
                         "metadata": row.get(metadata_key) or {}, "tools": row.get(tool_key) if tool_key else None})
    if not rows:
        raise DataError(f"{what}: {path} holds no samples; point it at a non-empty jsonl file")
    return rows


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
) -> list[Prompt]:
    prompts = []
    for row in read_jsonl(path, input_key, label_key, metadata_key, what, tool_key):
        raw = row["prompt"]
        if apply_chat_template:
            messages = raw if isinstance(raw, list) else [{"role": "user", "content": str(raw)}]
            tools = {"tools": row["tools"]} if row["tools"] else {}  # data.tool_key: the template lists the tools
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **tools)
        elif isinstance(raw, list):
            raise DataError(f"{path}: chat-list prompts need data.apply_chat_template=true")
        else:
            text = str(raw)
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        if max_prompt_len is not None and len(tokens) > max_prompt_len:
            continue
        label = None if row["label"] is None else str(row["label"])
        prompts.append(Prompt(raw, text, tokens, label, row["metadata"]))
    if not prompts:
        raise DataError(f"{what}: every prompt in {path} is longer than data.rollout_max_prompt_len={max_prompt_len}")
    return prompts
