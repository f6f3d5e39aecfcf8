"""The engine loop: generate, reward, advantages, train, sync weights, eval, save, log.

Everything else (what a backend is, how a loss aggregates, where metrics go) is decided by the
components handed in; this file only orders the steps, for train_mode=sync and async alike: the two
differ only in where the next rollout comes from (engine/feeds.py: generated when asked, or ahead).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from slime_hydra.engine import checkpoint as ckpt
from slime_hydra.engine.collect import RolloutPlan, collect_rollout, weight_lag_metrics, write_rollout_data
from slime_hydra.engine.components import Components, engine_state
from slime_hydra.engine.feeds import AheadGenerator, RolloutFeed, SyncFeed
from slime_hydra.engine.offload import trainer_released
from slime_hydra.engine.report import Progress
from slime_hydra.engine.rollout_hooks import postprocessed
from slime_hydra.engine.steps import advantages, evaluate, logged, rollout_metrics
from slime_hydra.engine.warmstart import WarmStart, run_warm_start


@dataclass(frozen=True)
class LoopSettings:
    """The typed values the loop reads, built from the RunConfig by the composition floor (app/session.py)."""

    num_rollout: int
    n_samples_per_prompt: int  # the group size
    rollout_plan: RolloutPlan  # one rollout's batch: over-sampling, the dynamic-sampling filter, partial rollout
    warm_start: Optional[WarmStart]  # None: none (warmstart.steps=0)
    train_async: bool  # train_mode=async: the next rollout generates while this one trains
    async_buffer_size: int
    async_rollout_timeout_s: float
    update_weights_interval: int
    eval_interval: Optional[int]
    skip_eval_before_train: bool
    save_eval_samples: bool
    save_interval: Optional[int]
    save_debug_rollout_data: Optional[str]
    progress_bar: bool
    offload_train: bool = False  # cluster.offload_train: the trainer is released while the engines generate (engine/offload.py)
    convert_samples: Optional[Callable] = None  # rollout.custom_convert_samples_to_train_data; None: training/batch.collate
    rollout_data_postprocess: Optional[Callable] = None  # rollout.rollout_data_postprocess: the batch before training


def run(settings: LoopSettings, c: Components, save_dir: str,
        stop: Callable[[], bool] = lambda: False) -> list[tuple[int, dict[str, float]]]:
    """The rollouts from the state's start to num_rollout; `stop()` true (a signal: app/stop.py) ends the loop after the
    step it is in, with that step's checkpoint written."""
    n, pad, s = settings.n_samples_per_prompt, c.tokenizer.pad_token_id, c.state
    if s.start_rollout == 0 and not stop():
        prepare(settings, c)
    feed = open_feed(settings, c, save_dir)
    bar = Progress(settings.num_rollout, s.start_rollout, settings.progress_bar)
    last_done = last_saved = None
    try:
        for rollout_id in range(s.start_rollout, settings.num_rollout):
            if stop():
                break
            step, t0 = rollout_id + 1, time.perf_counter()
            with trainer_released(c.trainer, settings.offload_train) as offload:  # cluster.offload_train
                got = feed.next(rollout_id)  # generate, reward, dynamic sampling (async: waits for the one generated ahead)
            samples, t1, g = got.samples, time.perf_counter(), got.group_size or n  # g: a generate hook's fan-out too
            batch = advantages(samples, c.advantage, g, pad, c.trainer, settings.convert_samples)  # advantages
            batch = postprocessed(settings.rollout_data_postprocess, rollout_id, batch)
            t2 = time.perf_counter()
            metrics = c.trainer.train_rollout(batch)  # train
            t3 = time.perf_counter()
            if due(step, settings.update_weights_interval, settings.num_rollout):
                feed.update_weights(c.trainer.named_weights(), step)  # sync weights (async: before its next generation)
            t4 = time.perf_counter()
            metrics |= rollout_metrics(samples, g) | got.metrics | weight_lag_metrics(samples, rollout_id) | c.scorer.metrics()
            # the backend's figures (sync requests, retries), the step's timings, the feed's (async: wait, generation rate)
            metrics |= c.rollout.metrics() | perf_metrics(samples, t0, t1, t2, t3, t4) | feed.metrics(got, t1 - t0)
            metrics |= c.source.metrics() | offload  # streamed data: bad rows skipped so far; the trainer's release
            if c.rollout_log is not None:  # logger.custom_rollout_log_function
                metrics = logged(c.rollout_log(rollout_id, samples, dict(metrics), t1 - t0), metrics, "rollout/")
            if settings.save_debug_rollout_data:
                write_rollout_data(settings.save_debug_rollout_data, rollout_id, got, c.rollout_dump_meta)
            if due(step, settings.eval_interval, settings.num_rollout) and c.eval_sets:  # eval, on the latest weights
                feed.settle()
                metrics |= run_eval(settings, c, step)
            s.history.append((step, metrics))
            # save, then log: a tracker that fails (its calls downgraded to warnings) never costs the checkpoint, and a
            # crash between the two leaves a point missing from the tracker (it is in the checkpoint), never a duplicate
            if stop() or due(step, settings.save_interval, settings.num_rollout):  # a stop saves the step it ended
                save(c, save_dir, rollout_id, feed)
                last_saved = rollout_id
            c.tracker.log_metrics(metrics, step)  # log
            bar.update(metrics)
            last_done = rollout_id
        if stop() and last_done is not None and last_saved != last_done:  # the signal came after the step's check
            save(c, save_dir, last_done, feed)
    finally:
        feed.close()
        bar.close()
    return s.history


def save(c: Components, save_dir: str, rollout_id: int, feed: RolloutFeed) -> None:
    """The checkpoint after `rollout_id`, with what the feed holds."""
    held = feed.state_dict()  # first: it drains the generation, so the buffer is at rest
    state = engine_state(c, rollout_id) | held
    ckpt.save_checkpoint(save_dir, rollout_id, ckpt.trainer_files(c.trainer, c.tokenizer), state)


def open_feed(settings: LoopSettings, c: Components, save_dir: str) -> RolloutFeed:
    collect = functools.partial(collect_rollout, c.rollout, c.buffer, c.scorer, c.sampling, settings.rollout_plan)
    if not settings.train_async:
        return SyncFeed(c.rollout, collect)
    version = c.state.ahead.get("async_published_version")  # resumed: published weights the worker had not applied
    return AheadGenerator(c.rollout, collect, num_rollout=settings.num_rollout, buffer_size=settings.async_buffer_size,
                          timeout_s=settings.async_rollout_timeout_s, resume_hint=lambda: ckpt.resume_hint(save_dir),
                          first_rollout_id=c.state.start_rollout, ready=c.state.ahead.get("async_ready", []),
                          published=None if version is None else (c.trainer.named_weights(), version))


def prepare(settings: LoopSettings, c: Components) -> None:
    """Before the first rollout: warm start, reference snapshot, weight sync, eval at step 0."""
    if settings.warm_start is not None:
        c.tracker.log_metrics(run_warm_start(settings.warm_start, c, settings.offload_train), 0)
    c.trainer.freeze_reference()
    c.rollout.update_weights(c.trainer.named_weights(), version=0)
    if c.eval_sets and not settings.skip_eval_before_train:
        metrics = run_eval(settings, c, 0)
        c.tracker.log_metrics(metrics, 0)
        c.state.history.append((0, metrics))


def run_eval(settings: LoopSettings, c: Components, step: int) -> dict[str, float]:
    sample_dir = Path(c.output_dir) / "eval" if settings.save_eval_samples else None
    with trainer_released(c.trainer, settings.offload_train):
        metrics, files = evaluate(c.rollout, c.eval_sets, step, sample_dir, generate=c.eval_function, log=c.eval_log)
    for f in files:
        c.tracker.log_artifact(str(f), f"eval/{f.parent.name}")
    return metrics


def due(step: int, interval: int | None, last: int) -> bool:
    return step == last or (interval is not None and step % interval == 0)


def perf_metrics(samples, t0: float, t1: float, t2: float, t3: float, t4: float) -> dict[str, float]:
    response_tokens = sum(s.response_length for s in samples)
    all_tokens = sum(len(s.tokens) for s in samples)
    return {
        "perf/rollout_time_s": t1 - t0,
        "perf/train_time_s": t3 - t2,
        "perf/weight_sync_time_s": t4 - t3,
        "perf/step_time_s": t4 - t0,
        "perf/rollout_tokens_per_s": response_tokens / max(t1 - t0, 1e-9),
        "perf/tokens_per_s": all_tokens / max(t4 - t0, 1e-9),
    }

