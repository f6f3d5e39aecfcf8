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
and the fix. Workers are daemons, killed when the reader closes or the driver exits.

Workers die with the driver, however it ends (a SIGKILL runs no exit handler): each asks the kernel for a SIGKILL
when its parent goes (prctl PR_SET_PDEATHSIG, Linux; only when the reader is opened on the main thread, since the
signal follows the thread that started the process), and each put on its bounded queue waits at most POLL_S at a
time, checking that its parent is still the driver, so a worker blocked on a full queue notices the driver's death
within POLL_S anywhere. Workers ignore SIGINT and SIGTERM: a Ctrl-C or a scheduler's signal to the process group is
the driver's to handle (it finishes its step, saves, then kills them), and a worker killed under it would fail
that step.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
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


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, pdeathsig: bool) -> None:
    """In a worker: SIGKILL when the parent goes (module docstring); exits at once if it is gone already."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if pdeathsig:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # not Linux: the parent check of each put remains
            pass
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(0)


def put_while_parent(q, item, parent: int) -> None:
    """q.put(item), waiting POLL_S at a time; exits the process when the parent is no longer `parent` (it died, and the
    worker was handed to another process): nobody will read the queue. os._exit: the queue's feeder thread, which
    a normal exit joins, may be blocked on the pipe to the dead driver."""
    while True:
        try:
            q.put(item, timeout=POLL_S)
            return
        except queue.Full:
            if os.getppid() != parent:
                os._exit(0)


def work(w: int, num_workers: int, files: list[DataFile], prep: Prep, start: Pos, block_rows: int, out, side,
         frontier, parent: int, pdeathsig: bool) -> None:
    """A worker's loop (the process target): its blocks' events, in order, until the reader closes or the driver
    (`parent`, its pid) dies."""
    die_with_parent(parent, pdeathsig)
    index = -1
    defer = can_defer(prep)
    try:
        for block in iter_blocks(files, start, block_rows, prep.max_line_bytes):
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
                put_while_parent(out, (index, _dumps((events, block.last))), parent)
    except DataError as e:
        put_while_parent(out, ("error", str(e)), parent)
    except Exception as e:  # noqa: BLE001 - reported to the driver, which stops the run
        put_while_parent(out, ("error", f"data worker {w} failed after block {index}: {type(e).__name__}: {e}"), parent)


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
            p.kill()  # workers ignore SIGTERM (module docstring) and hold nothing to flush
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
        self.own_blocks = iter_blocks(files, start, block_rows, prep.max_line_bytes) if driver_reads else None
        self.read_by_driver = self.made_by_driver = 0  # blocks read, rows templated and tokenized in the driver
        self.waiting: dict[Pos, list[Pending]] = {}  # deferred rows the driver read, by position: a worker makes them too
        self.queues = [ctx.Queue(maxsize=prefetch) for _ in range(num_workers)]
        self.side = ctx.Queue()
        # the death signal follows the thread that starts a worker: only asked for from the main thread (docstring)
        pdeathsig = threading.current_thread() is threading.main_thread()
        self.procs = [ctx.Process(target=work, args=(w, num_workers, files, prep, start, block_rows, self.queues[w], self.side,
                                                     self.frontier, os.getpid(), pdeathsig),
                                  daemon=True, name=f"slime-hydra-data-{w}") for w in range(num_workers)]
        for p in self.procs:
            p.start()
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.queues + [self.side])
        # at exit, before multiprocessing's own exit handler (registered earlier, so run later), which would
        # terminate and then join the workers: they ignore SIGTERM, and its join would wait forever
        atexit.register(self._finalizer)

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
