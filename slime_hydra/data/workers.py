"""Data workers (data.num_workers > 0): reading, checking, chat templating and tokenizing in processes.

Worker w of W processes the blocks whose index is w modulo W (every worker walks the same block
sequence, readers.iter_blocks, and processes only its own), and puts them on its own bounded queue
(`prefetch` blocks), so the workers stay at most W × prefetch blocks ahead and the driver takes block
i from queue i mod W: the same events in the same order as with num_workers=0.

The driver never waits for a block (unless it is told to, `driver_reads=False`): when block i is not on
its worker's queue yet (the worker is still starting: a spawned worker imports the tokenizer's
libraries first, seconds; or it is behind), the driver reads it itself, as num_workers=0 does
(deferring the template and the tokens where it can: readers.py), and moves a shared `frontier` past it;
a worker does not send the blocks behind the frontier on its queue. So the first batch never waits for the workers' start,
and the workers never make the driver slower than reading alone. The rows the driver deferred are made
by the workers anyway: a worker makes each of its blocks the driver has read (the last BACKFILL_BLOCKS of
them, if it is further behind) and sends (position, Prompt) of their rows on a side queue, or the block
itself if it was on its way; the driver makes only the rows it serves before theirs arrive. A worker
that has sent nothing for data.worker_timeout_s while the driver read its blocks is an error too.

Workers are spawned, not forked: the driver may hold CUDA, Ray or torch threads that a fork would copy
in an unknown state. Every wait on a worker has the deadline data.worker_timeout_s (which also covers
its start); a worker that dies, stalls or raises stops the run with a DataError naming it, the block
and the fix. Workers are daemons, terminated when the reader closes or the driver exits.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import pickle
import queue
import time
import weakref

from slime_hydra.config.datafiles import DataFile
from slime_hydra.data.readers import Pending, Pos, Prep, can_defer, finish, iter_blocks, process_block
from slime_hydra.errors import DataError

POLL_S = 0.2  # how often a wait checks that the worker is alive
BACKFILL_BLOCKS = 64  # the driver's deferred blocks a worker still makes when behind (older rows are likely served)


def _backfill(block, files: list[DataFile], prep: Prep, side) -> None:
    """A block the driver read with deferred rows, made here: (position, Prompt) of its good rows."""
    side.put([(pos, prompt) for kind, prompt, pos in process_block(block, files, prep) if kind == "ok"])


def work(w: int, num_workers: int, files: list[DataFile], prep: Prep, start: Pos, block_rows: int, out, side,
         frontier) -> None:
    """A worker's loop (the process target): its blocks' events, in order, until the reader closes."""
    index = -1
    defer = can_defer(prep)
    try:
        for block in iter_blocks(files, start, block_rows):
            index = block.index
            if index % num_workers != w:
                continue
            behind = frontier.value - index  # > 0: the driver has read it, deferring its rows (if it can)
            if behind > 0 and (not defer or behind > BACKFILL_BLOCKS):
                continue
            events = process_block(block, files, prep)
            if index < frontier.value:  # made for the driver's deferred rows, which are in its buffer
                side.put((w, _dumps([(pos, p) for kind, p, pos in events if kind == "ok"])))
            else:
                out.put((index, _dumps((events, block.last))))
    except DataError as e:
        out.put(("error", str(e)))
    except Exception as e:  # noqa: BLE001 - reported to the driver, which stops the run
        out.put(("error", f"data worker {w} failed after block {index}: {type(e).__name__}: {e}"))


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _loads(data: bytes):
    """A block's Prompts, unpickled with the garbage collector paused: the thousands of objects of a block would
    otherwise set off collections that walk the driver's whole heap (3x the time of the unpickling itself)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return pickle.loads(data)
    finally:
        if enabled:
            gc.enable()


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
    `driver_reads`: the driver reads a block itself when it is not on its worker's queue yet (module docstring);
    without, the driver waits for the workers, which read every block."""

    def __init__(self, files: list[DataFile], prep: Prep, start: Pos, num_workers: int, timeout_s: float,
                 block_rows: int = 512, prefetch: int = 4, driver_reads: bool = True):
        ctx = mp.get_context("spawn")
        self.files, self.prep, self.start, self.driver_reads = files, prep, start, driver_reads
        self.num_workers, self.timeout_s, self.next_index = num_workers, timeout_s, 0
        self.frontier = ctx.RawValue("q", 0)  # blocks before it are the driver's (one writer: no lock)
        self.heard = [time.monotonic()] * num_workers  # when each worker last sent a block
        self.own_blocks = iter_blocks(files, start, block_rows) if driver_reads else None
        self.read_by_driver = self.made_by_driver = 0  # blocks read, rows templated and tokenized in the driver
        self.waiting: dict[Pos, list[Pending]] = {}  # deferred rows the driver read, by position: a worker makes them too
        self.queues = [ctx.Queue(maxsize=prefetch) for _ in range(num_workers)]
        self.side = ctx.Queue()
        self.procs = [ctx.Process(target=work, args=(w, num_workers, files, prep, start, block_rows, self.queues[w], self.side,
                                                     self.frontier),
                                  daemon=True, name=f"slime-hydra-data-{w}") for w in range(num_workers)]
        for p in self.procs:
            p.start()
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.queues + [self.side])

    def __iter__(self):
        return self

    def _made(self, events: list) -> None:
        """A worker's events of a block the driver read: the Prompts of its deferred rows."""
        for kind, prompt, pos in events:
            if kind == "ok":
                for p in self.waiting.pop(pos, ()):
                    p.prompt = prompt

    def _driver_block(self):
        """Block next_index: from its worker if there already, else read here; None with driver_reads=False."""
        if not self.driver_reads:
            return None
        i, w = self.next_index, self.next_index % self.num_workers
        block = next(self.own_blocks)  # the driver walks every block, to read the ones it takes
        assert block.index == i
        self.next_index += 1
        while True:
            try:
                got, payload = self.queues[w].get_nowait()
            except queue.Empty:
                break
            self.heard[w] = time.monotonic()
            if got == "error":
                self.close()
                raise DataError(payload)
            if got == i:
                self.frontier.value = i + 1
                return _loads(payload)
            assert got < i, f"data worker {w} sent block {got}, expected {i}"
            self._made(_loads(payload)[0])  # a block the driver read before the worker had it
        self.frontier.value = i + 1
        p = self.procs[w]
        if not p.is_alive():
            self.close()
            raise DataError(f"data worker {w} (pid {p.pid}) died with exit code {p.exitcode} before sending block {i} of the "
                            f"stream started at (file, row, byte) {self.start}; set data.num_workers=0 to read in the "
                            "driver and see the error")
        if time.monotonic() - self.heard[w] > self.timeout_s:
            self.close()
            raise DataError(f"data worker {w} (pid {p.pid}) sent nothing for {self.timeout_s:g} s (data.worker_timeout_s) "
                            f"while the driver read its blocks (block {i} of the stream started at (file, row, byte) "
                            f"{self.start}); raise data.worker_timeout_s, or set data.num_workers=0 to read in the driver")
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
            self.heard[made[0]] = time.monotonic()
            self._made([("ok", prompt, pos) for pos, prompt in _loads(made[1])])

    def finish(self, items: list) -> list:
        self._take_made()
        self.made_by_driver += sum(isinstance(p, Pending) and p.prompt is None for p in items)
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
        return _loads(payload)

    def close(self) -> None:
        self._finalizer()
