"""Data workers (data.num_workers > 0): reading, checking, chat templating and tokenizing in processes.

Worker w of W processes the blocks whose index is w modulo W (every worker walks the same block
sequence, readers.iter_blocks, and processes only its own), and puts them on its own bounded queue
(`prefetch` blocks), so the workers stay at most W × prefetch blocks ahead and the driver takes block
i from queue i mod W: the same events in the same order as with num_workers=0.

Workers are spawned, not forked: the driver may hold CUDA, Ray or torch threads that a fork would copy
in an unknown state. Every wait on a worker has the deadline data.worker_timeout_s (which also covers
its start); a worker that dies, stalls or raises stops the run with a DataError naming it, the block
and the fix. Workers are daemons, terminated when the reader closes or the driver exits.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import weakref

from slime_hydra.config.datafiles import DataFile
from slime_hydra.data.readers import Pos, Prep, iter_blocks, process_block
from slime_hydra.errors import DataError

POLL_S = 0.2  # how often a wait checks that the worker is alive


def work(w: int, num_workers: int, files: list[DataFile], prep: Prep, start: Pos, block_rows: int, out) -> None:
    """A worker's loop (the process target): its blocks' events, in order, until the reader closes."""
    index = -1
    try:
        for block in iter_blocks(files, start, block_rows):
            index = block.index
            if index % num_workers == w:
                out.put((index, (process_block(block, files, prep), block.last)))
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
    """An endless iterator of (events, last) per block, read by `num_workers` processes ahead of the driver."""

    def __init__(self, files: list[DataFile], prep: Prep, start: Pos, num_workers: int, timeout_s: float,
                 block_rows: int = 512, prefetch: int = 4):
        ctx = mp.get_context("spawn")
        self.num_workers, self.timeout_s, self.next_index, self.start = num_workers, timeout_s, 0, start
        self.queues = [ctx.Queue(maxsize=prefetch) for _ in range(num_workers)]
        self.procs = [ctx.Process(target=work, args=(w, num_workers, files, prep, start, block_rows, self.queues[w]),
                                  daemon=True, name=f"slime-hydra-data-{w}") for w in range(num_workers)]
        for p in self.procs:
            p.start()
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.queues)

    def __iter__(self):
        return self

    def __next__(self) -> tuple[list, bool]:
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
