"""Where the loop's next rollout comes from: `SyncFeed` generates it when asked; `AheadGenerator` (train_mode=async,
slime's train_async.py) has it generated ahead, while the previous one trains.

engine/loop.py orders the steps for both; a feed decides only where the samples come from, where weights
go, and what a checkpoint keeps of it. The AheadGenerator's single generation worker produces rollouts in
order, up to `async_buffer_size` ahead of the trainer, so rollout k+1 is generated while rollout k trains
(one-step off-policy with the default of 1). Weights are published every `update_weights_interval`
rollouts and applied by the worker before it starts its next generation, never in the middle of one.
Each submission carries the weights to apply, so the schedule, and therefore the run, is the same
whatever the thread timing (exact with async_buffer_size=1; with more, a rollout may start before
the latest weights are published, which changes only how stale it is). Eval and save first wait for
the in-flight generations; a checkpoint stores the finished rollouts still waiting, which a resumed
run trains first. The old log-probs are the rollout's (validation turns on use_rollout_logprobs), so
the importance ratio is against the weights that generated each token.

With the local backend the worker is a thread: torch releases the GIL inside its ops, and the rollout
has its own model copy. The machine's intra-op threads are split between the two sides.

Every wait on the worker has a deadline: a rollout whose generation runs past `async_rollout_timeout_s`
(counted from its start), or a worker thread that ended, stops the run with a RunError (exit 3) naming the
rollout, the key, where the worker is, and the checkpoint to resume from. The worker is a daemon thread
(not a ThreadPoolExecutor's, which the interpreter joins at exit), so a generation stuck in a hook does not
keep the failed run alive.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import traceback
from collections import deque
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

import torch

from slime_hydra.data.buffer import sample_from_dict, sample_to_dict
from slime_hydra.engine.collect import Collected
from slime_hydra.errors import RunError
from slime_hydra.protocols import RolloutBackend, Weights

KEY = "async_rollout_timeout_s"
CLOSE_WAIT_S = 30.0  # at close, how long a generation still running (the run failed elsewhere) may take to finish


class RolloutFeed(Protocol):
    def next(self, rollout_id: int) -> Collected:
        """The rollout to train as `rollout_id` (generated, rewarded, dynamically sampled)."""
        ...

    def update_weights(self, named_weights: Weights, version: int) -> None:
        """The trainer's new weights, for the generations from now on."""
        ...

    def metrics(self, got: Collected, wait_s: float) -> dict[str, float]:
        """This feed's figures for `got`, whose `next` took `wait_s`; they override the loop's of the same name."""
        ...

    def settle(self) -> None:
        """Nothing generating and the rollout backend on the latest weights (before an eval)."""
        ...

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the feed; called before the engine's state is read (it drains first)."""
        ...

    def close(self) -> None: ...


class SyncFeed:
    """train_mode=sync: each rollout is generated when the loop asks for it, on the weights just synced."""

    def __init__(self, rollout: RolloutBackend, collect: Callable[[int], Collected]):
        self.rollout, self.collect = rollout, collect

    def next(self, rollout_id: int) -> Collected:
        return self.collect(rollout_id)

    def update_weights(self, named_weights: Weights, version: int) -> None:
        self.rollout.update_weights(named_weights, version=version)

    def metrics(self, got: Collected, wait_s: float) -> dict[str, float]:
        return {}  # the loop's perf/rollout_* are this rollout's generation

    def settle(self) -> None:
        pass  # nothing runs between steps

    def state_dict(self) -> dict:
        return {}

    def close(self) -> None:
        pass


@dataclass
class Job:
    rollout_id: int
    future: Future
    started: Optional[float] = None  # time.monotonic() when the worker began it


class Worker:
    """One daemon thread running jobs in submission order."""

    def __init__(self, num_threads: int):
        self.jobs: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.ended: Optional[BaseException] = None  # what ended the thread, when not a stop
        self.thread = threading.Thread(target=self._run, args=(num_threads,), name="rollout-worker", daemon=True)
        self.thread.start()

    def submit(self, rollout_id: int, fn: Callable[..., Any], *args: Any) -> Job:
        job = Job(rollout_id, Future())
        self.jobs.put((job, fn, args))
        return job

    def _run(self, num_threads: int) -> None:
        torch.set_num_threads(num_threads)
        while not self.stop.is_set():
            try:
                job, fn, args = self.jobs.get(timeout=0.5)  # idle: look at the stop flag twice a second
            except queue.Empty:
                continue
            if not job.future.set_running_or_notify_cancel():
                continue
            job.started = time.monotonic()
            try:
                job.future.set_result(fn(*args))
            except Exception as e:  # noqa: BLE001 - raised in the trainer's thread by wait()
                job.future.set_exception(e)
            except BaseException as e:  # SystemExit from a hook: the thread ends here
                self.ended = e
                job.future.set_exception(e)
                return

    def where(self) -> str:
        """The worker's innermost frames, for a message."""
        frame = sys._current_frames().get(self.thread.ident or -1)
        if frame is None:
            return "the worker thread has ended"
        stdlib = os.path.dirname(threading.__file__)  # threading's and asyncio's frames say nothing about the stall
        last = [f for f in traceback.extract_stack(frame) if not f.filename.startswith(stdlib)][-2:]
        return "the worker is in " + " <- ".join(f"{f.name} ({'/'.join(f.filename.split(os.sep)[-2:])}:{f.lineno})"
                                                 for f in reversed(last))


class AheadGenerator:
    """train_mode=async: rollouts produced in order by one worker, up to `buffer_size` ahead of the one training;
    `next()` waits for the oldest, within `timeout_s` of the start of its generation. `ready`: finished rollouts
    from a checkpoint (trained first); `published`: the checkpoint's published weights the worker had not applied."""

    def __init__(self, rollout: RolloutBackend, collect: Callable[[int], Collected], *, num_rollout: int, buffer_size: int,
                 timeout_s: float, resume_hint: Callable[[], str], first_rollout_id: int, ready: list[dict],
                 published: Optional[tuple[Weights, int]] = None):
        self.rollout, self.collect, self.timeout_s, self.resume_hint = rollout, collect, timeout_s, resume_hint
        self.num_rollout, self.buffer_size = num_rollout, buffer_size
        self.threads = torch.get_num_threads()
        self.side_threads = max(1, self.threads // 2)
        torch.set_num_threads(self.side_threads)  # the trainer's half; the worker sets its own
        self.worker = Worker(self.side_threads)
        self.queue: deque[Job] = deque(Job(first_rollout_id + i, done_future(collected_from_dict(d)))
                                       for i, d in enumerate(ready))
        self.next_id = first_rollout_id + len(self.queue)
        self.weights: Optional[tuple[Weights, int]] = None  # published, not yet applied by the worker
        self.hung = False
        if published is not None:
            self.update_weights(*published)

    def update_weights(self, named_weights: Weights, version: int) -> None:
        """Published: the worker applies them before it starts its next generation. Snapshotted here, in the loop's
        thread, between train steps (the Ray ranks stage theirs: a collective that must not race the training)."""
        self.weights = (named_weights.snapshot(), version)

    def fill(self, ahead: int) -> None:
        while len(self.queue) < ahead:
            weights, self.weights = self.weights, None
            self.queue.append(self.worker.submit(self.next_id, self._one, self.next_id, weights))
            self.next_id += 1

    def next(self, rollout_id: int) -> Collected:
        self.fill(1)
        got = self.wait(self.queue.popleft())
        self.fill(min(self.buffer_size, self.num_rollout - rollout_id - 1))  # rollout k+1 generates while k trains
        return got

    def metrics(self, got: Collected, wait_s: float) -> dict[str, float]:
        """Generated ahead, the loop's perf/rollout_time_s is only the wait: the rate is over the worker's generation."""
        generate_s = got.metrics.get("perf/rollout_generate_s", wait_s)
        return {"perf/rollout_wait_s": wait_s,
                "perf/rollout_tokens_per_s": sum(s.response_length for s in got.samples) / max(generate_s, 1e-9)}

    def wait(self, job: Job) -> Collected:
        """The job's result, or a RunError once its generation has run `timeout_s` or the worker is gone."""
        waiting_since = time.monotonic()
        while not job.future.done():
            elapsed = time.monotonic() - (job.started if job.started is not None else waiting_since)
            if elapsed > self.timeout_s:
                self.hung = True
                raise RunError(f"async rollout queue: rollout {job.rollout_id} (generated ahead by the rollout worker "
                               f"thread) did not finish within {KEY}={self.timeout_s:g} s of the start of its "
                               f"generation; {self.worker.where()}. Raise {KEY} if generation is only slow. "
                               f"{self.resume_hint()}")
            if not self.worker.thread.is_alive() and not job.future.done():
                raise RunError(f"async rollout queue: rollout {job.rollout_id} will not be generated: the rollout worker "
                               f"thread ended ({self.worker.ended!r}). {self.resume_hint()}")
            wait_futures([job.future], timeout=min(1.0, self.timeout_s - elapsed + 0.01))
        err = job.future.exception(timeout=0)
        if err is not None and not isinstance(err, Exception):  # SystemExit and the like: the thread that raised it is gone
            raise RunError(f"async rollout queue: the rollout worker thread ended on {err!r} while generating rollout "
                           f"{job.rollout_id}. {self.resume_hint()}") from err
        return job.future.result(timeout=0)

    def _one(self, rollout_id: int, weights: Optional[tuple[Weights, int]]) -> Collected:
        t0 = time.perf_counter()
        if weights is not None:
            self.rollout.update_weights(weights[0], version=weights[1])
        got = self.collect(rollout_id)
        got.metrics["perf/rollout_generate_s"] = time.perf_counter() - t0
        return got

    def drain(self) -> None:
        for job in self.queue:
            self.wait(job)

    def settle(self) -> None:
        """No generation in flight, and the rollout holds the latest published weights (for eval)."""
        self.drain()
        if self.weights is not None:
            self.rollout.update_weights(self.weights[0], version=self.weights[1])
            self.weights = None

    def state_dict(self) -> dict:
        """The finished rollouts still waiting (generation drained first) and the published version."""
        self.drain()
        return {"async_ready": [collected_to_dict(self.wait(job)) for job in self.queue],
                "async_published_version": None if self.weights is None else self.weights[1]}

    def close(self) -> None:
        """Cancels what has not started; a generation still running gets CLOSE_WAIT_S to finish (none when it is the
        one that timed out): after that the daemon thread is left behind, never joined without a deadline."""
        self.worker.stop.set()
        for job in self.queue:
            job.future.cancel()
        self.worker.thread.join(timeout=0 if self.hung else CLOSE_WAIT_S)
        torch.set_num_threads(self.threads)


def done_future(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def collected_to_dict(got: Collected) -> dict:
    return {"samples": [sample_to_dict(s) for s in got.samples], "metrics": dict(got.metrics),
            "dropped": [([sample_to_dict(s) for s in g], reason) for g, reason in got.dropped], "group_size": got.group_size}


def collected_from_dict(d: dict) -> Collected:
    return Collected([sample_from_dict(s) for s in d["samples"]], dict(d["metrics"]),
                     [([sample_from_dict(s) for s in g], reason) for g, reason in d["dropped"]], d.get("group_size", 0))
