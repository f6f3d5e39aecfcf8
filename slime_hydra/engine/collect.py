"""One rollout's batch: over-sampling rounds, rewards, dynamic sampling, abort and partial rollout.

slime's semantics: each round takes `over_sampling_batch_size` groups from the buffer (groups that
came back first, then fresh prompts), generates them, scores each group as it finishes and runs it
through `dynamic_sampling_filter`; rounds repeat until `rollout_batch_size` groups have passed. Then
whatever is still generating is aborted (`RolloutBackend.abort`) and every unused group goes back to
the buffer: with `partial_rollout` keeping the tokens it has (continued in a later round, the stale
prefix loss-masked with `mask_offpolicy_in_partial_rollout`), otherwise reset to a fresh prompt.
A dropped group is consumed, as in slime. Sync and async loops share this function.

A generate hook that returns several samples for one (agent/hook.py) leaves the rest on the sample's `siblings`:
a finished group takes them in, after their sample, before it is scored and judged. `rollout.rollout_function`
replaces all of this; the rollout sample filter and the all-samples process then run on what either gave
(engine/rollout_hooks.py has their contracts).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

from slime_hydra.aio import run_sync
from slime_hydra.data.buffer import DataBuffer, Group, is_done
from slime_hydra.data.rollout_dump import write_rollout_dump
from slime_hydra.engine.rollout_hooks import call_rollout_function, finish_groups, group_size, take_siblings
from slime_hydra.errors import RunError
from slime_hydra.protocols import RolloutBackend, Scorer
from slime_hydra.types import Sample, SamplingParams, Status


@dataclass(frozen=True)
class RolloutPlan:
    """One rollout's batch as the collector makes it (rollout.*, built by the composition floor: app/session.py),
    the dynamic-sampling filter already an object."""

    rollout_batch_size: int
    over_sampling_batch_size: int
    dynamic_sampling_filter: Optional[Callable] = None
    partial_rollout: bool = False
    mask_offpolicy_in_partial_rollout: bool = False
    max_rounds: int = 100
    rollout_function: Optional[Callable] = None  # rollout.rollout_function: replaces the collector
    rollout_sample_filter: Optional[Callable] = None
    rollout_all_samples_process: Optional[Callable] = None


@dataclass
class Collected:
    samples: list[Sample]  # rollout_batch_size groups, each contiguous
    metrics: dict[str, float]
    dropped: list[tuple[Group, str]]  # for debug dumps
    group_size: int = 0  # samples per group (a generate hook returning k samples: k * n_samples_per_prompt); 0: n


def collect_rollout(rollout: RolloutBackend, buffer: DataBuffer, scorer: Scorer, sampling: SamplingParams,
                    plan: RolloutPlan, rollout_id: int = 0) -> Collected:
    """Rollout `rollout_id`'s batch: by the collector below, or by rollout.rollout_function; then the sample filter
    and the all-samples process."""
    if plan.rollout_function is not None:
        kept, metrics = run_sync(call_rollout_function(
            plan.rollout_function, rollout_id, buffer, rollout=rollout, scorer=scorer, sampling=sampling,
            rollout_batch_size=plan.rollout_batch_size))
        dropped: list[tuple[Group, str]] = []
        key = "rollout.rollout_function"
    else:
        kept, dropped, metrics = run_sync(_collect(rollout, buffer, scorer, sampling, plan))
        key = "rollout.custom_generate"
    finish_groups(kept, kept + [g for g, _ in dropped], buffer, plan.rollout_sample_filter,
                  plan.rollout_all_samples_process)
    return Collected([s for g in kept for s in g], metrics, dropped, group_size(kept, key))


async def _collect(rollout: RolloutBackend, buffer: DataBuffer, scorer: Scorer, sampling: SamplingParams,
                   plan: RolloutPlan) -> tuple[list[Group], list[tuple[Group, str]], dict[str, float]]:
    kept: list[Group] = []
    dropped: list[tuple[Group, str]] = []
    rounds = returned = partial = 0
    # a cooperative backend yields after every decode step: checking each time makes the abort point exact
    poll = 0 if rollout.cooperative else 0.002
    while len(kept) < plan.rollout_batch_size:
        rounds += 1
        if rounds > plan.max_rounds:
            reasons = ", ".join(f"{n} {r}" for r, n in Counter(r for _, r in dropped).most_common(3))
            raise RunError(f"dynamic sampling: {len(kept)} of rollout.rollout_batch_size={plan.rollout_batch_size} "
                           f"groups passed rollout.dynamic_sampling_filter in rollout.max_dynamic_sampling_rounds="
                           f"{plan.max_rounds} rounds of {plan.over_sampling_batch_size} groups ({len(dropped)} dropped: "
                           f"{reasons}); loosen the filter, raise rollout.over_sampling_batch_size or "
                           "rollout.max_dynamic_sampling_rounds")
        groups = buffer.get_groups(plan.over_sampling_batch_size)
        todo = [s for g in groups for s in g if not is_done(s)]
        first_version = {id(s): s.weight_version for s in todo if s.response_length}  # continued partial samples
        partial += len(first_version)
        if plan.mask_offpolicy_in_partial_rollout:
            for s in todo:
                if s.response_length and s.weight_version < rollout.weight_version:
                    s.loss_mask = [0] * s.response_length
        task = asyncio.ensure_future(rollout.generate(todo, sampling))
        pending = list(groups)
        while pending and len(kept) < plan.rollout_batch_size:
            finished = [g for g in pending if all(is_done(s) for s in g)]
            for g in finished:
                if len(kept) >= plan.rollout_batch_size:
                    break
                pending.remove(g)
                take_siblings(g)
                for s in g:
                    if id(s) in first_version:  # staleness is that of the oldest part
                        s.weight_version = min(s.weight_version, first_version[id(s)])
                unscored = [s for s in g if s.reward is None]
                if unscored:
                    await scorer.score_async(unscored)
                keep, reason = _judge(plan.dynamic_sampling_filter, g)
                (kept.append(g) if keep else dropped.append((g, reason)))
            if len(kept) >= plan.rollout_batch_size:
                rollout.abort()
                break
            if task.done() and not finished:
                break  # a backend that left samples unfinished without an abort: hand them back below
            await (asyncio.sleep(0) if poll == 0 else asyncio.wait({task}, timeout=poll))
        await task
        for g in pending:  # aborted, never started, or surplus: back to the buffer
            for s in g:
                if id(s) in first_version:
                    s.weight_version = min(s.weight_version, first_version[id(s)])
                if s.status == Status.PENDING and s.response_length:
                    s.status = Status.ABORTED
        returned += len(pending)
        buffer.add_groups(pending, keep_generation=plan.partial_rollout)
    reasons = Counter(r for _, r in dropped)
    metrics = {"rollout/dynamic_sampling_rounds": float(rounds), "rollout/dynamic_sampling_dropped": float(len(dropped)),
               "rollout/returned_groups": float(returned), "rollout/continued_samples": float(partial),
               "rollout/buffer_groups": float(len(buffer))}
    metrics |= {f"rollout/dynamic_sampling_dropped_{r}": float(n) for r, n in reasons.items()}
    return kept, dropped, metrics


def _judge(fn: Optional[Callable], group: Group) -> tuple[bool, str]:
    if fn is None:
        return True, ""
    out = fn(group)
    if isinstance(out, tuple):
        return bool(out[0]), str(out[1])
    return bool(out), getattr(fn, "__name__", getattr(getattr(fn, "func", None), "__name__", "filter"))


def weight_lag_metrics(samples: list[Sample], trained_version: int) -> dict[str, float]:
    """Staleness: how many weight updates behind the trainer each sample's generating weights are."""
    lags = [trained_version - s.weight_version for s in samples]
    return {"rollout/weight_version_lag_mean": sum(lags) / len(lags), "rollout/weight_version_lag_max": float(max(lags))}


def write_rollout_data(template: str, rollout_id: int, got: Collected, meta: dict) -> None:
    """save_debug_rollout_data (a directory, or a path with "{rollout_id}"): every sample, the trained ones and the
    dropped ones (with the reason), in the versioned format a replay reads (data/rollout_dump.py)."""
    write_rollout_dump(template, rollout_id, got.samples, got.dropped, meta)
