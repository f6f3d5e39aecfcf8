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
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import torch

from slime_hydra.config.schema import RunConfig
from slime_hydra.data.buffer import sample_from_dict, sample_to_dict
from slime_hydra.engine import checkpoint as ckpt
from slime_hydra.engine.build import Components, engine_state
from slime_hydra.engine.collect import Collected, RolloutPlan, collect_rollout, rollout_plan, weight_lag_metrics, write_rollout_data
from slime_hydra.engine.loop import due, perf_metrics, prepare, run_eval
from slime_hydra.engine.report import Progress
from slime_hydra.engine.steps import advantages, rollout_metrics


def run(cfg: RunConfig, c: Components, save_dir: str) -> list[tuple[int, dict[str, float]]]:
    n, pad = cfg.rollout.n_samples_per_prompt, c.tokenizer.pad_token_id
    if c.start_rollout == 0:
        prepare(cfg, c)
    gen = AheadGenerator(c, rollout_plan(cfg.rollout), c.ready.get("async_ready", []))
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
                write_rollout_data(cfg.save_debug_rollout_data, rollout_id, got)
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


class AheadGenerator:
    """Rollouts produced in order by one worker; `next()` waits for the oldest."""

    def __init__(self, c: Components, plan: RolloutPlan, ready: list[dict]):
        self.c, self.plan = c, plan
        self.threads = torch.get_num_threads()
        self.side_threads = max(1, self.threads // 2)
        torch.set_num_threads(self.side_threads)  # the trainer's half; the worker sets its own below
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rollout", initializer=torch.set_num_threads,
                                       initargs=(self.side_threads,))
        self.queue: deque[Future] = deque(done_future(collected_from_dict(d)) for d in ready)
        self.weights: Optional[tuple[list, int]] = None  # published, not yet applied by the worker

    def publish(self, named_weights, version: int) -> None:
        self.weights = ([(name, t.detach().clone()) for name, t in named_weights], version)

    def fill(self, ahead: int) -> None:
        while len(self.queue) < ahead:
            weights, self.weights = self.weights, None
            self.queue.append(self.pool.submit(self._one, weights))

    def next(self) -> Collected:
        self.fill(1)
        return self.queue.popleft().result()

    def _one(self, weights: Optional[tuple[list, int]]) -> Collected:
        t0 = time.perf_counter()
        if weights is not None:
            self.c.rollout.update_weights(weights[0], version=weights[1])
        got = collect_rollout(self.c.rollout, self.c.buffer, self.c.scorer, self.c.sampling, self.plan)
        got.metrics["perf/rollout_generate_s"] = time.perf_counter() - t0
        return got

    def drain(self) -> None:
        for f in self.queue:
            f.result()

    def drain_and_sync(self) -> None:
        """No generation in flight, and the rollout holds the latest published weights (for eval)."""
        self.drain()
        if self.weights is not None:
            self.c.rollout.update_weights(self.weights[0], version=self.weights[1])
            self.weights = None

    def state_dict(self) -> dict:
        """The finished rollouts still waiting (generation drained first) and the published version."""
        self.drain()
        return {"async_ready": [collected_to_dict(f.result()) for f in self.queue],
                "async_published_version": None if self.weights is None else self.weights[1]}

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
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
