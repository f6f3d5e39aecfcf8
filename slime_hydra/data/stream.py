"""The streaming prompt source (data.streaming=true): prompts read as they are needed, memory flat in the file.

It serves groups as `source.PromptSource` does (the same `next_groups`, `state_dict`), from a reader
(readers.LocalReader, or workers.WorkerReader with data.num_workers > 0) that yields checked, tokenized
prompts in file order, pass after pass. Each epoch goes through a shuffle buffer of
`data.shuffle_buffer_size` prompts: filled first, then every new prompt takes the place of one drawn
at random, which is served; at the end of the pass the rest is shuffled and served. The draws come
from random.Random(rollout_seed * 1_000_003 + epoch), the generator the in-memory source uses.

Order, against the in-memory source: with rollout.rollout_shuffle=false both serve file order. With a
buffer at least as large as the data set the two orders are equal (nothing is drawn until the end of
the pass, then the same shuffle of the same list). With a smaller buffer they differ, necessarily: a
uniform permutation of N rows needs all N (or their offsets) in memory, which is what streaming
avoids. The order is still a pure function of (files, seed, epoch, buffer size): every epoch serves
each good prompt exactly once, and a prompt moves at most `shuffle_buffer_size` places earlier.

Time to the first batch: the buffer fills before the first prompt is served (the in-memory order needs
it), so the first batch costs shuffle_buffer_size rows read, whatever the file's size; without
data.rollout_max_prompt_len the reader defers the chat template and the tokenizer of a row until it is
served (readers.py), so those rows are only parsed and checked. The epoch's length is not needed (the
pass ends when the reader reaches the end of the last file), so nothing counts the rows first.

Bad rows: a bad row is met when the reader reaches it, not at load; data.on_bad_row=error stops at the
first one with the in-memory path's `path:line: problem` lines (the rows after it are not checked yet),
skip drops it and counts it once (`skipped_rows`, first epoch only).

The state (checkpointed) is the in-memory source's three integers plus the reader's position, the
buffer's prompts, the generator's state and the skip count: a resumed run serves exactly the prompts an
uninterrupted one would, reading on from the position without reading what came before.
"""

from __future__ import annotations

import functools
import logging
import random
from typing import Callable, Iterator, Optional

from slime_hydra.config.datafiles import DataFile
from slime_hydra.data.dataset import Prompt, PromptList
from slime_hydra.data.readers import START, LocalReader, Pos, Prep
from slime_hydra.data.source import prompt_group
from slime_hydra.data.workers import WorkerReader
from slime_hydra.errors import DataError
from slime_hydra.types import Sample

log = logging.getLogger(__name__)

Reader = Iterator[tuple[list, bool]]  # (events of a block, whether it ends a pass); has finish(items) and close()


class StreamingPromptSource:
    def __init__(self, open_reader: Callable[[Pos], Reader], n_samples_per_prompt: int, shuffle: bool, seed: int,
                 buffer_size: int, on_bad_row: str = "error", what: str = "data.prompt_data"):
        self.open_reader = open_reader
        self.n_samples_per_prompt = n_samples_per_prompt
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_size = buffer_size
        self.on_bad_row = on_bad_row
        self.what = what
        self.epoch = self.offset = self.next_group_index = 0
        self.pos: Pos = START  # after the last row taken from the reader
        self.buffer: list[Prompt] = []  # while draining: the rest of the epoch, last served first
        self.draining = False
        self.rng = self._epoch_rng(0)
        self.skipped_rows = 0
        self.overlong_rows = 0  # prompts over data.rollout_max_prompt_len met so far (first epoch)
        self._events: list = []
        self._i = 0
        self._ends_pass = False
        self.reader: Optional[Reader] = open_reader(START)

    def _epoch_rng(self, epoch: int) -> random.Random:
        return random.Random(self.seed * 1_000_003 + epoch)

    def _next_row(self) -> Optional[Prompt]:
        """The next good prompt the reader gives; None at the end of a pass."""
        while True:
            if self._i == len(self._events):
                if self._ends_pass:
                    self._ends_pass, self.pos = False, START
                    return None
                self._events, last = next(self.reader)
                self._i, self._ends_pass = 0, last
                continue
            kind, payload, self.pos = self._events[self._i]
            self._i += 1
            if kind == "ok":
                return payload
            if kind == "bad":
                self._bad(payload)
            elif kind == "drop" and self.epoch == 0:  # longer than data.rollout_max_prompt_len
                self.overlong_rows += 1

    def _bad(self, problems: list[str]) -> None:
        if self.on_bad_row == "error":
            raise DataError(f"{self.what}: a bad row (streaming stops at the first one it reads; the rows after it are not "
                            "checked yet); fix it, or set data.on_bad_row=skip to train on the good rows only:\n"
                            + "\n".join(f"  {p}" for p in problems))
        if self.epoch == 0:
            self.skipped_rows += 1
            if self.skipped_rows <= 3:
                log.warning("%s: skipped a bad row (data.on_bad_row=skip): %s", self.what, problems[0])

    def _next_prompt(self) -> Prompt:
        while True:
            if not self.draining:
                p = self._next_row()
                if p is None:  # end of the pass: the rest of the buffer, shuffled, first element served first
                    self.draining = True
                    if self.shuffle:
                        self.rng.shuffle(self.buffer)
                    self.buffer.reverse()
                elif not self.shuffle:
                    return p
                elif len(self.buffer) < self.buffer_size:
                    self.buffer.append(p)
                else:
                    i = self.rng.randrange(self.buffer_size)
                    p, self.buffer[i] = self.buffer[i], p
                    return p
                continue
            if self.buffer:
                return self.buffer.pop()
            if self.offset == 0:
                raise DataError(f"{self.what}: a whole pass over the data gave no prompt (every row is bad, or longer "
                                "than data.rollout_max_prompt_len); fix the rows or raise data.rollout_max_prompt_len")
            self.epoch, self.offset, self.draining = self.epoch + 1, 0, False
            self.rng = self._epoch_rng(self.epoch)

    def next_groups(self, num_groups: int) -> list[list[Sample]]:
        picked = []
        for _ in range(num_groups):
            picked.append(self._next_prompt())
            self.offset += 1
        groups = []
        for p in self.reader.finish(picked):  # deferred rows: templated and tokenized together, as they are served
            groups.append(prompt_group(p, self.next_group_index, self.n_samples_per_prompt))
            self.next_group_index += 1
        return groups

    def metrics(self) -> dict[str, float]:
        """data/skipped_rows: bad rows met so far (first epoch), with data.on_bad_row=skip; data/overlong_rows: prompts
        dropped for their length so far (first epoch)."""
        out = {"data/overlong_rows": float(self.overlong_rows)}
        return out | ({"data/skipped_rows": float(self.skipped_rows)} if self.on_bad_row == "skip" else {})

    def state_dict(self) -> dict:
        stream = {"pos": self.pos, "buffer": list(self.buffer), "draining": self.draining, "rng": self.rng.getstate(),
                  "skipped_rows": self.skipped_rows, "overlong_rows": self.overlong_rows, "buffer_size": self.buffer_size}
        return {"epoch": self.epoch, "offset": self.offset, "next_group_index": self.next_group_index, "stream": stream}

    def load_state_dict(self, state: dict) -> None:
        s = state.get("stream")
        if s is None:
            raise DataError("the checkpoint was written with data.streaming=false; resume it with data.streaming=false "
                            "(the two sources order prompts differently)")
        if s["buffer_size"] != self.buffer_size:
            raise DataError(f"the checkpoint was written with data.shuffle_buffer_size={s['buffer_size']}; resume with "
                            "that value (the order depends on it)")
        self.epoch, self.offset, self.next_group_index = state["epoch"], state["offset"], state["next_group_index"]
        self.pos, self.buffer, self.draining = tuple(s["pos"]), list(s["buffer"]), s["draining"]
        self.rng = random.Random()
        self.rng.setstate(s["rng"])
        self.skipped_rows = s["skipped_rows"]
        self.overlong_rows = s.get("overlong_rows", 0)  # a checkpoint from before the count
        self.close()
        self._events, self._i, self._ends_pass = [], 0, False
        self.reader = self.open_reader(self.pos)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


def streaming_source(files: list[DataFile], prep: Prep, n_samples_per_prompt: int, shuffle: bool, seed: int,
                     buffer_size: int, on_bad_row: str, num_workers: int, worker_timeout_s: float) -> StreamingPromptSource:
    """The source over `files`, read in the driver (num_workers=0) or by worker processes."""
    if num_workers:
        open_reader = functools.partial(WorkerReader, files, prep, num_workers=num_workers, timeout_s=worker_timeout_s)
    else:
        open_reader = functools.partial(LocalReader, files, prep)
    return StreamingPromptSource(open_reader, n_samples_per_prompt, shuffle, seed, buffer_size, on_bad_row)


def read_head(files: list[DataFile], prep: Prep, n: int, on_bad_row: str, what: str = "data.prompt_data") -> PromptList:
    """The first `n` good prompts of the data, in file order (at most one pass), for what needs a list in memory:
    the warm start samples its SFT batches and accuracy checks from them."""
    src = StreamingPromptSource(functools.partial(LocalReader, files, prep), 1, False, 0, 1, on_bad_row, what)
    out = PromptList()
    while len(out) < n and (p := src._next_row()) is not None:
        out.append(p)
    out[:] = src.reader.finish(out)
    src.close()
    if not out:
        raise DataError(f"{what}: a whole pass over the data gave no prompt (every row is bad, or longer than "
                        "data.rollout_max_prompt_len); fix the rows or raise data.rollout_max_prompt_len")
    return out
