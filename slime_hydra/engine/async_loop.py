"""`train_mode=async`: the engine loop with generation running ahead of training (slime's train_async.py).

The steps are loop.py's; only the waits move. A single generation worker produces rollouts in order,
up to `async_buffer_size` ahead of the trainer, so rollout k+1 is generated while rollout k trains
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
from typing import Any, Callable, Optional

import torch

from slime_hydra.config.schema import RunConfig
from slime_hydra.data.buffer import sample_from_dict, sample_to_dict
from slime_hydra.engine import checkpoint as ckpt
from slime_hydra.engine.build import Components, engine_state
from slime_hydra.engine.collect import Collected, RolloutPlan, collect_rollout, rollout_plan, weight_lag_metrics, write_rollout_data
from slime_hydra.engine.loop import due, perf_metrics, prepare, run_eval
from slime_hydra.engine.report import Progress
from slime_hydra.engine.checkpoint import resume_hint
from slime_hydra.engine.steps import advantages, rollout_metrics
from slime_hydra.errors import RunError

KEY = "async_rollout_timeout_s"
CLOSE_WAIT_S = 30.0  # at close, how long a generation still running (the run failed elsewhere) may take to finish


def run(cfg: RunConfig, c: Components, save_dir: str) -> list[tuple[int, dict[str, float]]]:
    n, pad = cfg.rollout.n_samples_per_prompt, c.tokenizer.pad_token_id
    if c.start_rollout == 0:
        prepare(cfg, c)
    gen = AheadGenerator(c, rollout_plan(cfg.rollout), c.ready.get("async_ready", []), cfg.async_rollout_timeout_s,
                         c.start_rollout, lambda: resume_hint(save_dir))
    if c.ready.get("async_published_version") is not None:  # resumed: published weights the worker had not applied
        gen.publish(c.trainer.named_weights(), c.ready["async_published_version"])
    bar = Progress(cfg.num_rollout, c.start_rollout, cfg.logger.progress_bar)
    try:
        for rollout_id in range(c.start_rollout, cfg.num_rollout):
            step, t0 = rollout_id + 1, time.perf_counter()
            got = gen.next()  # wait for rollout k (generated ahead)
            gen.fill(min(cfg.async_buffer_size, cfg.num_rollout - step))  # rollout k+1 generates while k trains
            samples, t1 = got.samples, time.perf_counter()
            batch = advantages(samples, cfg.algorithm, n, pad, c.trainer)  # advantages
            t2 = time.perf_counter()
            metrics = c.trainer.train_rollout(batch)  # train
            t3 = time.perf_counter()
            if due(step, cfg.update_weights_interval, cfg.num_rollout):
                gen.publish(c.trainer.named_weights(), step)  # sync weights: before the next generation starts
            t4 = time.perf_counter()
            metrics |= rollout_metrics(samples, n) | got.metrics | weight_lag_metrics(samples, rollout_id) | c.scorer.metrics()
            # the backend's figures: a sync among them is the worker's latest (applied before a generation)
            metrics |= c.rollout.metrics() | perf_metrics(samples, t0, t1, t2, t3, t4) | {"perf/rollout_wait_s": t1 - t0}
            # generated ahead, so t1 - t0 is only the wait: the rate is over the worker's own generation time
            generate_s = got.metrics.get("perf/rollout_generate_s", t1 - t0)
            metrics["perf/rollout_tokens_per_s"] = sum(s.response_length for s in samples) / max(generate_s, 1e-9)
            if cfg.save_debug_rollout_data:
                write_rollout_data(cfg.save_debug_rollout_data, rollout_id, got, c.rollout_dump_meta)
            if due(step, cfg.eval.eval_interval, cfg.num_rollout) and c.eval_sets:  # eval, on the latest weights
                gen.drain_and_sync()
                metrics |= run_eval(cfg, c, step)
            c.tracker.log_metrics(metrics, step)  # log
            c.history.append((step, metrics))
            bar.update(metrics)
            if due(step, cfg.save_interval, cfg.num_rollout):  # save, with the rollouts still waiting
                waiting = gen.state_dict()  # drains the generation first: the buffer is at rest
                state = engine_state(c, rollout_id) | waiting
                ckpt.save_checkpoint(save_dir, rollout_id, ckpt.trainer_files(c.trainer, c.tokenizer), state)
    finally:
        gen.close()
        bar.close()
    return c.history


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
    """Rollouts produced in order by one worker; `next()` waits for the oldest, within `timeout_s` of its start."""

    def __init__(self, c: Components, plan: RolloutPlan, ready: list[dict], timeout_s: float, first_rollout_id: int,
                 resume_hint: Callable[[], str]):
        self.c, self.plan, self.timeout_s, self.resume_hint = c, plan, timeout_s, resume_hint
        self.threads = torch.get_num_threads()
        self.side_threads = max(1, self.threads // 2)
        torch.set_num_threads(self.side_threads)  # the trainer's half; the worker sets its own
        self.worker = Worker(self.side_threads)
        self.queue: deque[Job] = deque(Job(first_rollout_id + i, done_future(collected_from_dict(d)))
                                       for i, d in enumerate(ready))
        self.next_id = first_rollout_id + len(self.queue)
        self.weights: Optional[tuple[list, int]] = None  # published, not yet applied by the worker
        self.hung = False

    def publish(self, named_weights, version: int) -> None:
        self.weights = ([(name, t.detach().clone()) for name, t in named_weights], version)

    def fill(self, ahead: int) -> None:
        while len(self.queue) < ahead:
            weights, self.weights = self.weights, None
            self.queue.append(self.worker.submit(self.next_id, self._one, weights))
            self.next_id += 1

    def next(self) -> Collected:
        self.fill(1)
        return self.wait(self.queue.popleft())

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

    def _one(self, weights: Optional[tuple[list, int]]) -> Collected:
        t0 = time.perf_counter()
        if weights is not None:
            self.c.rollout.update_weights(weights[0], version=weights[1])
        got = collect_rollout(self.c.rollout, self.c.buffer, self.c.scorer, self.c.sampling, self.plan)
        got.metrics["perf/rollout_generate_s"] = time.perf_counter() - t0
        return got

    def drain(self) -> None:
        for job in self.queue:
            self.wait(job)

    def drain_and_sync(self) -> None:
        """No generation in flight, and the rollout holds the latest published weights (for eval)."""
        self.drain()
        if self.weights is not None:
            self.c.rollout.update_weights(self.weights[0], version=self.weights[1])
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
            "dropped": [([sample_to_dict(s) for s in g], reason) for g, reason in got.dropped]}


def collected_from_dict(d: dict) -> Collected:
    return Collected([sample_from_dict(s) for s in d["samples"]], dict(d["metrics"]),
                     [([sample_from_dict(s) for s in g], reason) for g, reason in d["dropped"]])
