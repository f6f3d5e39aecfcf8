"""Reads a prompt file row by row and checks every row before anything trains on it.

jsonl: one JSON object per line; each line is decoded as UTF-8 on its own, so a bad byte names its
line and the lines after it are still checked. parquet: one record per row; `path:N` names the N-th
row (1-based), as a line number does in jsonl.

Overlong input is a bad row like any other, never a traceback or a line read whole: a line longer than
`data.max_line_bytes` is skipped over in chunks without being kept (`read_lines`), and a line nested deeper than
Python's JSON parser goes (a RecursionError) is reported as such, both as `path:line: problem`.

A row is checked for what the loader relies on: the prompt is a string or a list of
{"role": str, "content": str} messages, the label is there (a string or a number), metadata is an
object, tools a list of objects. Every problem of a file is collected. `on_bad_row="error"` raises
them together (the first MAX_SHOWN, then a count of the rest); `"skip"` drops the bad rows and names
the first few in a warning. Checks that need the tokenizer (prompt length, chat template) stay in
dataset.py.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from slime_hydra.config.schema import DataConfig
from slime_hydra.errors import DataError

log = logging.getLogger(__name__)

MAX_SHOWN = 20  # a screenful of problems; the rest are counted
SKIP_CHUNK = 1 << 20  # bytes read at a time while skipping over an overlong line
ON_BAD_ROW = ("error", "skip")
BLANK = object()  # a blank jsonl line: no row
MAX_LINE_BYTES = DataConfig.max_line_bytes  # for callers without a config (tests, tools)


@dataclass(frozen=True)
class RowKeys:
    """A row's field names, and the config group that sets input_key and label_key (named in messages)."""

    input_key: str
    label_key: Optional[str]
    metadata_key: str = "metadata"
    tool_key: Optional[str] = None
    prefix: str = "data"  # or "eval.eval_prompt_data.<name>"; tool_key is always data.*
    generate_hooks: frozenset[str] = frozenset()  # the names metadata.custom_generate may take (rollout.generate_hooks)


@dataclass
class Rows:
    rows: list[dict] = field(default_factory=list)  # {"prompt", "label", "metadata", "tools", "line"}
    skipped: list[str] = field(default_factory=list)  # one "path:line: problem" per skipped row


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, as a user reads it in the file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__  # parquet: bytes, dates, ...


def _prompt_problems(prompt: Any, key: str, cfg_key: str) -> list[str]:
    shape = '{"role": "user", "content": "..."}'
    if isinstance(prompt, str):
        return []
    if not isinstance(prompt, (list, tuple)):
        return [f"{key!r} ({cfg_key}) is {json_type(prompt)}; it must be a string or a list of {shape} messages"]
    if not prompt:
        return [f"{key!r} ({cfg_key}) is an empty message list; give it at least one {shape} message"]
    problems = []
    for i, msg in enumerate(prompt):
        where = f"{key!r} message {i}"
        if not isinstance(msg, dict):
            problems.append(f"{where} ({cfg_key}) is {json_type(msg)}; each message must be an object {shape}")
            continue
        for part in ("role", "content"):
            if part not in msg:
                problems.append(f"{where} ({cfg_key}) has no {part!r}; give every message a string {part!r}")
            elif not isinstance(msg[part], str):
                problems.append(f"{where} ({cfg_key}): {part!r} is {json_type(msg[part])}; it must be a string")
    return problems


def check_row(row: Any, keys: RowKeys) -> list[str]:
    """Every problem of one parsed row (without the path:line prefix); [] for a good row."""
    if not isinstance(row, dict):
        return [f"expected a JSON object per line, got {json_type(row)}; write one {{...}} object per line"]
    problems = []
    for key, name in ((keys.input_key, "input_key"), (keys.label_key, "label_key")):
        if key is not None and key not in row:
            problems.append(f"missing key {key!r} ({keys.prefix}.{name}); keys on this line: {sorted(row)}; "
                            f"set {keys.prefix}.{name} to one of them"
                            + (" (or eval=none to run without this eval set)" if keys.prefix.startswith("eval.") else ""))
    if keys.input_key in row:
        problems += _prompt_problems(row[keys.input_key], keys.input_key, f"{keys.prefix}.input_key")
    if keys.label_key is not None and keys.label_key in row:
        label = row[keys.label_key]
        if label is None or isinstance(label, bool) or not isinstance(label, (str, int, float)):
            problems.append(f"{keys.label_key!r} ({keys.prefix}.label_key) is {json_type(label)}; "
                            "the reward compares the response with it: give a string or a number")
    meta = row.get(keys.metadata_key)
    if meta is not None and not isinstance(meta, dict):
        problems.append(f"{keys.metadata_key!r} ({keys.prefix}.metadata_key) is {json_type(meta)}; it must be an object or absent")
    elif meta and meta.get("custom_generate") is not None:
        problems += _hook_problems(meta["custom_generate"], keys)
    tools = row.get(keys.tool_key) if keys.tool_key else None
    if tools is not None and not (isinstance(tools, (list, tuple)) and all(isinstance(t, dict) for t in tools)):
        problems.append(f"{keys.tool_key!r} (data.tool_key) is {json_type(tools)}; it must be a list of tool objects or absent")
    return problems


def _hook_problems(name: Any, keys: RowKeys) -> list[str]:
    """A row's metadata.custom_generate must be a name of rollout.generate_hooks: data names no code of its own."""
    if isinstance(name, str) and name in keys.generate_hooks:
        return []
    known = f"one of {sorted(keys.generate_hooks)}" if keys.generate_hooks else "a name registered there (none is)"
    what = f"{name!r:.80}" if isinstance(name, str) else json_type(name)
    return [f"'{keys.metadata_key}.custom_generate' is {what}; a row picks its generate hook by name only, {known}: "
            "register the hook in the config as +rollout.generate_hooks.<name>={_target_: pkg.mod.fn} and write <name> "
            "in the row"]


class Overlong:
    """A line longer than data.max_line_bytes, skipped over: only its length is kept (`len` of it, as of a line)."""

    def __init__(self, size: int, limit: int):
        self.size, self.limit = size, limit

    def __len__(self) -> int:
        return self.size


def read_lines(fh, max_bytes: int) -> Iterator[bytes | Overlong]:
    """The lines of a binary file (newline kept), each read only up to max_bytes: a longer one comes as an Overlong
    holding its length, its bytes read in SKIP_CHUNK pieces and dropped."""
    while line := fh.readline(max_bytes + 1):
        if len(line) <= max_bytes:
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n") and (line := fh.readline(SKIP_CHUNK)):
            size += len(line)
        yield Overlong(size, max_bytes)


def parse_jsonl_line(lineno: int, raw: bytes | Overlong) -> tuple[Any, Optional[str]]:
    """(parsed value or None, problem or None) of one raw line; (BLANK, None) for a blank line."""
    if isinstance(raw, Overlong):
        return None, (f"the line is {raw.size:,} bytes, over data.max_line_bytes={raw.limit:,} (read no further); shorten "
                      "the row, or raise data.max_line_bytes if it is meant to be this long")
    try:  # utf-8-sig on line 1: a byte-order mark is not an error
        text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        return None, (f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                      "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or fix this line")
    if not text.strip():
        return BLANK, None
    try:
        return json.loads(text.rstrip("\r\n")), None  # the newline would move an error's column
    except json.JSONDecodeError as e:
        return None, f"malformed JSON ({e.msg} at column {e.colno}); fix or remove this line"
    except RecursionError:
        return None, "JSON nested too deeply to parse (RecursionError); flatten this row"


def iter_jsonl(path: str, max_line_bytes: int) -> Iterator[tuple[int, Any, Optional[str]]]:
    """(line number, parsed value or None, problem or None) for every non-blank line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(read_lines(f, max_line_bytes), start=1):
            value, problem = parse_jsonl_line(lineno, raw)
            if value is not BLANK:
                yield lineno, value, problem


def iter_parquet(path: str) -> Iterator[tuple[int, Any, Optional[str]]]:
    """(row number, row as a dict, None): parquet's own types stand in for JSON's."""
    import pyarrow  # lazy: only parquet files need it (it comes with ray and mlflow)
    import pyarrow.parquet as pq

    try:
        n = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                n += 1
                yield n, row, None
    except (pyarrow.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable parquet file ({e}); rewrite it, or give a jsonl file") from None


def good_row(row: dict, keys: RowKeys, line: int) -> dict:
    """A checked row as the loader keeps it."""
    tools = row.get(keys.tool_key) if keys.tool_key else None
    return {"prompt": row[keys.input_key], "label": None if keys.label_key is None else row[keys.label_key],
            "metadata": row.get(keys.metadata_key) or {}, "tools": tools, "line": line}


def render(path: str, problems: list[str], bad_rows: int, total_rows: int, what: str) -> str:
    head = (f"{what}: {bad_rows} of {total_rows} rows of {path} are bad; fix them, or set data.on_bad_row=skip "
            "to train on the good rows only:")
    lines = [head] + [f"  {p}" for p in problems[:MAX_SHOWN]]
    if len(problems) > MAX_SHOWN:
        lines.append(f"  ... and {len(problems) - MAX_SHOWN} more problems ({len(problems)} in all)")
    return "\n".join(lines)


def read_rows(path: str, keys: RowKeys, what: str, on_bad_row: str = "error",
              iter_fn: Optional[Callable[[str], Iterator]] = None, max_line_bytes: int = MAX_LINE_BYTES) -> Rows:
    """The good rows of a jsonl or parquet file (or what `iter_fn` reads, e.g. a Hugging Face dataset directory);
    bad ones raise (all together) or are skipped."""
    if on_bad_row not in ON_BAD_ROW:
        raise DataError(f"data.on_bad_row={on_bad_row!r} is not one of {list(ON_BAD_ROW)}")
    if iter_fn is None and not Path(path).is_file():
        raise DataError(f"{what}: file not found: {path}; set it to an existing jsonl or parquet file")
    if iter_fn is None:
        iter_fn = iter_parquet if path.endswith(".parquet") else functools.partial(iter_jsonl, max_line_bytes=max_line_bytes)
    out, problems, total = Rows(), [], 0
    for line, row, problem in iter_fn(path):
        total += 1
        found = [problem] if problem else check_row(row, keys)
        if found:
            problems += [f"{path}:{line}: {p}" for p in found]
            out.skipped.append(f"{path}:{line}: {found[0]}")
            continue
        out.rows.append(good_row(row, keys, line))
    if problems and on_bad_row == "error":
        raise DataError(render(path, problems, len(out.skipped), total, what))
    if out.skipped:
        log.warning("%s: skipped %d bad rows of %d in %s (data.on_bad_row=skip), the first: %s", what, len(out.skipped),
                    total, path, "; ".join(out.skipped[:3]))
    if not out.rows:
        fix = "every row is bad; fix them" if total else "point it at a file with one JSON object per line"
        raise DataError(f"{what}: {path} holds no samples; {fix}")
    return out
