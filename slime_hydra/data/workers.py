"""Data workers (data.num_workers > 0): reading, checking, chat templating and tokenizing in processes.

Worker w of W processes the blocks whose index is w modulo W (every worker walks the same block
sequence, readers.iter_blocks, and processes only its own), and puts them on its own bounded queue
(`prefetch` blocks), so the workers stay at most W × prefetch blocks ahead and the driver takes block
i from queue i mod W: the same events in the same order as with num_workers=0.

The driver never waits for a block that no worker has taken: a block is the driver's or a worker's, as
whoever takes it first under a shared lock decides (`frontier`: the blocks the driver has passed; a slot
per block records a worker's claim). Until a worker has started (a spawned worker imports the
tokenizer's libraries first: seconds) or when the workers fall behind, the driver reads the next block
itself, as num_workers=0 does (deferring the template and the tokens where it can: readers.py), and the
worker that owns it skips it. So the first batch never waits for the workers' start, and the workers
never make the driver slower than reading alone. The rows the driver deferred are made by the workers
too, when their queues are full (they are otherwise idle): each sends (position, Prompt) of those rows
on a side queue, and the driver makes only those it serves before theirs arrive.

Workers are spawned, not forked: the driver may hold CUDA, Ray or torch threads that a fork would copy
in an unknown state. Every wait on a worker has the deadline data.worker_timeout_s (which also covers
its start); a worker that dies, stalls or raises stops the run with a DataError naming it, the block
and the fix. Workers are daemons, terminated when the reader closes or the driver exits.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import queue
import time
import weakref

from slime_hydra.config.datafiles import DataFile
from slime_hydra.data.readers import Pending, Pos, Prep, can_defer, finish, iter_blocks, process_block
from slime_hydra.errors import DataError

POLL_S = 0.2  # how often a wait checks that the worker is alive
BACKFILL_BLOCKS = 64  # the driver's deferred blocks a worker keeps to make (the latest; older ones are likely served)


def _backfill(block, files: list[DataFile], prep: Prep, side) -> None:
    """A block the driver read with deferred rows, made here: (position, Prompt) of its good rows."""
    side.put([(pos, prompt) for kind, prompt, pos in process_block(block, files, prep) if kind == "ok"])


def work(w: int, num_workers: int, files: list[DataFile], prep: Prep, start: Pos, block_rows: int, out, side,
         lock, frontier, slots) -> None:
    """A worker's loop (the process target): its blocks' events, in order, until the reader closes."""
    index = -1
    todo: collections.deque = collections.deque(maxlen=BACKFILL_BLOCKS)  # blocks the driver read with deferred rows
    try:
        for block in iter_blocks(files, start, block_rows):
            index = block.index
            if index % num_workers != w:
                continue
            with lock:  # the driver's already (it passed it), or this worker's
                taken = index < frontier.value
                if not taken:
                    slots[index % len(slots)] = index + 1
            if taken:
                if can_defer(prep):
                    todo.append(block)
                continue
            item = (index, (process_block(block, files, prep), block.last))
            while True:  # while the queue is full, make the driver's deferred rows
                try:
                    out.put(item, block=not todo)
                    break
                except queue.Full:
                    _backfill(todo.popleft(), files, prep, side)
    except DataError as e:
        out.put(("error", str(e)))
    except Exception as e:  # noqa: BLE001 - reported to the driver, which stops the run
        out.put(("error", f"data worker {w} failed after block {index}: {type(e).__name__}: {e}"))


def _stop(procs: list, queues: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
    for q in queues:
        q.cancel_join_thread()
        q.close()


class WorkerReader:
    """An endless iterator of (events, last) per block, read by `num_workers` processes ahead of the driver.
    `driver_reads`: the driver reads a block itself when no worker has taken it (module docstring); without,
    the workers read every block."""

    def __init__(self, files: list[DataFile], prep: Prep, start: Pos, num_workers: int, timeout_s: float,
                 block_rows: int = 512, prefetch: int = 4, driver_reads: bool = True):
        ctx = mp.get_context("spawn")
        self.files, self.prep, self.start, self.driver_reads = files, prep, start, driver_reads
        self.num_workers, self.timeout_s, self.next_index = num_workers, timeout_s, 0
        # a worker claims a block at most num_workers * (prefetch + 2) blocks ahead of the driver: slots never collide
        self.lock, self.frontier = ctx.Lock(), ctx.RawValue("q", 0)
        self.slots = ctx.RawArray("q", max(1024, 8 * num_workers * (prefetch + 2)))
        self.own_blocks = iter_blocks(files, start, block_rows) if driver_reads else None
        self.read_by_driver = 0  # blocks
        self.waiting: dict[Pos, list[Pending]] = {}  # deferred rows the driver read, by position: a worker makes them too
        self.queues = [ctx.Queue(maxsize=prefetch) for _ in range(num_workers)]
        self.side = ctx.Queue()
        self.procs = [ctx.Process(target=work, args=(w, num_workers, files, prep, start, block_rows, self.queues[w], self.side,
                                                     self.lock, self.frontier, self.slots),
                                  daemon=True, name=f"slime-hydra-data-{w}") for w in range(num_workers)]
        for p in self.procs:
            p.start()
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.queues + [self.side])

    def __iter__(self):
        return self

    def _driver_block(self):
        """The next block, read in the driver if no worker has taken it; else None."""
        if not self.driver_reads:
            return None
        i = self.next_index
        block = next(self.own_blocks)  # the driver walks every block, to read the ones it takes
        assert block.index == i
        with self.lock:
            self.frontier.value = i + 1
            if self.slots[i % len(self.slots)] == i + 1:
                return None
        self.next_index += 1
        self.read_by_driver += 1
        events = process_block(block, self.files, self.prep, can_defer(self.prep))
        for kind, payload, pos in events:
            if kind == "ok" and isinstance(payload, Pending):
                self.waiting.setdefault(pos, []).append(payload)
        return events, block.last

    def _take_made(self) -> None:
        """The deferred rows the workers have made so far (without waiting)."""
        while True:
            try:
                made = self.side.get_nowait()
            except queue.Empty:
                return
            for pos, prompt in made:
                for p in self.waiting.pop(pos, ()):
                    p.prompt = prompt

    def finish(self, items: list) -> list:
        self._take_made()
        for p in items:  # served: no longer waited for (what `waiting` holds stays within the shuffle buffer)
            if isinstance(p, Pending) and (same := self.waiting.get(p.pos)) is not None:
                same[:] = [q for q in same if q is not p]
                if not same:
                    del self.waiting[p.pos]
        return finish(items, self.prep)

    def __next__(self) -> tuple[list, bool]:
        if (own := self._driver_block()) is not None:
            return own
        w, index = self.next_index % self.num_workers, self.next_index
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                got, payload = self.queues[w].get(timeout=POLL_S)
                break
            except queue.Empty:
                p = self.procs[w]
                where = f"block {index} of the stream started at (file, row, byte) {self.start}"
                if not p.is_alive():
                    self.close()
                    raise DataError(f"data worker {w} (pid {p.pid}) died with exit code {p.exitcode} before sending {where}; "
                                    "set data.num_workers=0 to read in the driver and see the error") from None
                if time.monotonic() > deadline:
                    self.close()
                    raise DataError(f"data worker {w} (pid {p.pid}) sent nothing for {self.timeout_s:g} s "
                                    f"(data.worker_timeout_s) while reading {where}; raise data.worker_timeout_s, or set "
                                    "data.num_workers=0 to read in the driver") from None
        if got == "error":
            self.close()
            raise DataError(payload)
        assert got == index, f"data worker {w} sent block {got}, expected {index}"
        self.next_index += 1
        return payload

    def close(self) -> None:
        self._finalizer()
