"""Prompt files read in blocks from a position, for the streaming source (stream.py) and its workers.

A position is (file index, rows read in that file, byte offset in that file): a jsonl file is seeked
to the byte, a parquet file skips whole row groups by their metadata, a Hugging Face dataset is
indexed; so reading resumes where a checkpoint left off without reading what came before. Blocks run
to the end of the last file, then start again at the first (one pass per epoch), forever.

A block becomes events, one per row: ("ok", Prompt), ("bad", ["path:line: problem", ...]) with the
problems `rows.check_row` finds (the in-memory path's words), or ("drop", None) for a prompt longer
than `data.rollout_max_prompt_len`; each with the position after its row. A block is tokenized in
one call (a fast tokenizer gives the same ids per text as one call per text).

Deferred rows: without data.rollout_max_prompt_len a row's tokens cannot make it bad, so a reader that
defers (`defer=True`) checks the row and leaves the chat template and the tokenizer for later: its "ok"
event carries a `Pending` (the checked row), which `finish` turns into the Prompt when it is served. The
shuffle buffer then fills at the speed of parsing (the first batch costs shuffle_buffer_size parses and
one batch of templating and tokenizing), and every prompt is still templated and tokenized once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional

from slime_hydra.config.datafiles import DataFile
from slime_hydra.data.dataset import columns_to_rows, open_dataset, render_text, to_prompt
from slime_hydra.data.rows import BLANK, MAX_LINE_BYTES, RowKeys, check_row, good_row, parse_jsonl_line, read_lines
from slime_hydra.errors import DataError

Pos = tuple[int, int, int]  # (file index, rows read in that file, byte offset in a jsonl file)
START: Pos = (0, 0, 0)


@dataclass
class Block:
    file_idx: int
    first_row: int  # 0-based row (jsonl: physical line) of the block's first row in its file
    offset: int  # byte offset of the first row (jsonl)
    lines: Optional[list] = None  # jsonl: raw lines (bytes), an overlong one as rows.Overlong
    batch: Any = None  # parquet: a pyarrow RecordBatch
    stop: int = 0  # hf: rows [first_row, stop)
    last: bool = False  # the last block of a pass over every file
    index: int = 0  # blocks since the stream started (which worker reads it)


@dataclass
class Pending:
    """A checked row whose chat template and tokens are still to come (module docstring); `prompt` is set
    when a data worker has made it (workers.WorkerReader), so that the driver need not."""

    row: dict  # rows.good_row's
    text: Optional[str]  # None: the chat template is still to apply
    pos: Pos
    prompt: Any = None


@dataclass(frozen=True)
class Prep:
    """How a row is read (max_line_bytes), and what turns a checked row into a Prompt."""

    keys: RowKeys
    tokenizer: Any
    apply_chat_template: bool = False
    max_prompt_len: Optional[int] = None
    max_line_bytes: int = MAX_LINE_BYTES
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # data.apply_chat_template_kwargs


_DATASETS: dict[str, Any] = {}  # path -> open memory-mapped dataset, one per process


def dataset(path: str):
    if path not in _DATASETS:
        _DATASETS[path] = open_dataset(path)
    return _DATASETS[path]


def _file_blocks(f: DataFile, fi: int, row: int, offset: int, rows: int, max_line_bytes: int) -> Iterator[Block]:
    if f.kind == "jsonl":
        with open(f.path, "rb") as fh:
            fh.seek(offset)
            lines_of = read_lines(fh, max_line_bytes)  # an overlong line comes as an Overlong (its length only)
            while lines := list(itertools.islice(lines_of, rows)):
                yield Block(fi, row, offset, lines=lines)
                row, offset = row + len(lines), offset + sum(map(len, lines))
    elif f.kind == "parquet":
        yield from _parquet_blocks(f.path, fi, row, rows)
    else:
        n = len(dataset(f.path))
        for start in range(row, n, rows):
            yield Block(fi, start, 0, stop=min(start + rows, n))


def _parquet_blocks(path: str, fi: int, row: int, rows: int) -> Iterator[Block]:
    import pyarrow  # lazy: only parquet files need it
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        group, first = 0, 0  # the row group holding `row`, and its first row
        while group < pf.num_row_groups and first + pf.metadata.row_group(group).num_rows <= row:
            first += pf.metadata.row_group(group).num_rows
            group += 1
        if group == pf.num_row_groups:
            return
        for batch in pf.iter_batches(batch_size=rows, row_groups=range(group, pf.num_row_groups)):
            if first + batch.num_rows <= row:  # resuming inside the first row group: rows already read
                first += batch.num_rows
                continue
            if first < row:
                batch, first = batch.slice(row - first), row
            yield Block(fi, first, 0, batch=batch)
            first += batch.num_rows
    except (pyarrow.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable parquet file ({e}); rewrite it, or give a jsonl file") from None


def iter_blocks(files: list[DataFile], start: Pos, rows: int, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Block]:
    """Blocks of at most `rows` rows from `start`, pass after pass; a pass with no rows is one empty last block."""
    index = 0
    while True:
        prev = None
        for fi in range(start[0], len(files)):
            row, offset = (start[1], start[2]) if fi == start[0] else (0, 0)
            for block in _file_blocks(files[fi], fi, row, offset, rows, max_line_bytes):
                if prev is not None:
                    prev.index, index = index, index + 1
                    yield prev
                prev = block
        prev = prev or Block(len(files) - 1, 0, 0, lines=[])
        prev.last, prev.index, index = True, index, index + 1
        yield prev
        start = START


def _rows(block: Block, files: list[DataFile]) -> Iterator[tuple[int, Pos, Any, Optional[str]]]:
    """(1-based line, position after it, parsed row, problem); blank jsonl lines are left out."""
    fi = block.file_idx
    if block.lines is not None:
        offset = block.offset
        for i, raw in enumerate(block.lines):
            offset += len(raw)
            value, problem = parse_jsonl_line(block.first_row + i + 1, raw)
            if value is not BLANK:
                yield block.first_row + i + 1, (fi, block.first_row + i + 1, offset), value, problem
        return
    rows = block.batch.to_pylist() if block.batch is not None else columns_to_rows(
        dataset(files[fi].path)[block.first_row:block.stop])
    for i, row in enumerate(rows):
        yield block.first_row + i + 1, (fi, block.first_row + i + 1, 0), row, None


def tokenize(texts: list[str], tokenizer) -> list[list[int]]:
    """The ids `tokenizer(text, add_special_tokens=False)` gives each text; a fast tokenizer's Rust core is called
    directly (transformers' wrapper around it costs as much as the encoding; tests compare the two)."""
    core = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if core is None or core.truncation is not None or core.padding is not None:
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [e.ids for e in core.encode_batch(texts, add_special_tokens=False)]


def can_defer(prep: Prep) -> bool:
    """Whether a row's goodness is known before its tokens (no data.rollout_max_prompt_len to drop by)."""
    return prep.max_prompt_len is None


def process_block(block: Block, files: list[DataFile], prep: Prep, defer: bool = False) -> list[tuple[str, Any, Pos]]:
    """The block's events, in row order (module docstring); `defer`: "ok" events carry Pendings."""
    assert not defer or can_defer(prep)
    path = files[block.file_idx].path
    events: list[list] = []
    good: list[tuple[int, dict, str]] = []  # (event index, row, text) of the rows to tokenize
    for line, pos, row, problem in _rows(block, files):
        found = [problem] if problem else check_row(row, prep.keys)
        if found:
            events.append(["bad", [f"{path}:{line}: {p}" for p in found], pos])
            continue
        row = good_row(row, prep.keys, line)
        if defer:  # a string prompt is checked for the template now (render_text's error), a chat list later
            text = None if prep.apply_chat_template else render_text(row, prep.tokenizer, False, path, prep.keys.input_key)
            events.append(("ok", Pending(row, text, pos), pos))
            continue
        good.append((len(events), row, render_text(row, prep.tokenizer, prep.apply_chat_template, path, prep.keys.input_key,
                                                     prep.template_kwargs)))
        events.append(["ok", None, pos])
    if good:
        ids = tokenize([text for _, _, text in good], prep.tokenizer)
        for (i, row, text), tokens in zip(good, ids):
            if prep.max_prompt_len is not None and len(tokens) > prep.max_prompt_len:
                events[i][0] = "drop"
            else:
                events[i][1] = to_prompt(row, text, tokens)
    return [tuple(e) for e in events]


def finish(items: list, prep: Prep) -> list:
    """`items` with every Pending made into its Prompt (the template and the tokenizer in one call each)."""
    todo = [i for i, p in enumerate(items) if isinstance(p, Pending) and p.prompt is None]
    if todo:
        texts = [items[i].text if items[i].text is not None else render_text(
            items[i].row, prep.tokenizer, True, "", prep.keys.input_key, prep.template_kwargs) for i in todo]
        for i, text, tokens in zip(todo, texts, tokenize(texts, prep.tokenizer)):
            items[i].prompt = to_prompt(items[i].row, text, tokens)
    return [p.prompt if isinstance(p, Pending) else p for p in items]


@dataclass
class LocalReader:
    """Blocks read and processed in the calling process (data.num_workers=0): an endless iterator of
    (events, last) per block, deferring the template and the tokens when it can (module docstring)."""

    files: list[DataFile]
    prep: Prep
    start: Pos = START
    block_rows: int = 512
    _blocks: Iterator[Block] = field(init=False)

    def __post_init__(self):
        self._blocks = iter_blocks(self.files, self.start, self.block_rows, self.prep.max_line_bytes)

    def __iter__(self):
        return self

    def __next__(self) -> tuple[list, bool]:
        block = next(self._blocks)
        return process_block(block, self.files, self.prep, can_defer(self.prep)), block.last

    def finish(self, items: list) -> list:
        return finish(items, self.prep)

    def close(self) -> None:
        pass
