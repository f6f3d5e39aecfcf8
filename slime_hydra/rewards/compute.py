"""Scores samples: per-sample `metadata.rm_type`, a custom `_target_`, a group reward, or a remote RM.

A reward may be a number or a dict; `reward_key` picks the scalar that trains (the dict is kept in
`sample.metadata["reward_dict"]`). Sync and async custom functions are both accepted.

Only finite numbers train. A reward that is not a number (a string, None, a dict without `reward_key`'s
entry) or is NaN / inf is a reward failure, as a remote RM that does not answer is: with
`reward.rm_on_failure=zero` it scores `reward.rm_failure_score` and is counted in `reward/invalid_rewards`
(the first few named in a warning); with `raise` it stops the run naming the sample and the value. A NaN
reward would otherwise turn every advantage of its group, then the gradient and the weights, into NaN.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
import time
from typing import Any, Callable, Optional, TypeVar

from slime_hydra.aio import run_sync
from slime_hydra.config.schema import RewardConfig
from slime_hydra.errors import RunError, UserError
from slime_hydra.rewards.remote import RemoteRewardModel, headers_from_env
from slime_hydra.rewards.verifiers import verifier
from slime_hydra.types import Sample

T = TypeVar("T")
log = logging.getLogger(__name__)
INVALID = "reward/invalid_rewards"
WARN_FIRST = 3  # invalid rewards named in a warning; the rest are counted


def call_with_deadline(fn: Callable[[], T], timeout_s: float) -> T:
    """fn() on a daemon thread while this thread waits for it, at most timeout_s: the caller blocks just as an
    inline call would (nothing else runs meanwhile), but a call that never returns raises TimeoutError instead
    of hanging the run, and cannot hold up the process's exit."""
    box: dict = {}
    done = threading.Event()

    def target():
        try:
            box["out"] = fn()
        except BaseException as e:  # re-raised in the caller
            box["err"] = e
        done.set()

    threading.Thread(target=target, name="custom-rm", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError
    if "err" in box:
        raise box["err"]
    return box["out"]


def reward_value(reward: Any, key: Optional[str]) -> float:
    """The scalar that trains, or ValueError saying why `reward` has none (not a number, not finite, no `key` entry).
    A dict reward with no reward.reward_key set is the config's to fix: UserError."""
    value = reward
    if isinstance(reward, dict):
        if key is None:
            raise UserError(f"reward: a dict reward {sorted(reward)} needs reward.reward_key to pick the scalar that "
                            f"trains; set reward.reward_key to one of {sorted(reward)}")
        if key not in reward:
            raise ValueError(f"the dict reward has no {key!r} entry (reward.reward_key); its keys: {sorted(reward)}")
        value = reward[key]
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        raise ValueError(f"{type(value).__name__} {value!r:.80} is not a number")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{out} is not a finite number")
    return out


async def _maybe_await(x):
    return await x if inspect.isawaitable(x) else x


class RewardScorer:
    """Built once per run from the reward config and, with reward.custom_rm, the function it names, loaded by the
    composition floor (app/plugins.reward_scorer); `score(samples)` fills `sample.reward` in place."""

    def __init__(self, cfg: RewardConfig, reward_key: Optional[str] = None, custom: Optional[Callable[..., Any]] = None):
        if bool(cfg.custom_rm) != (custom is not None):
            raise ValueError("reward.custom_rm and the function loaded from it come together (app/plugins.reward_scorer)")
        self.cfg = cfg
        self.reward_key = reward_key if reward_key is not None else cfg.reward_key
        self.custom = custom  # its keys bound (inspect still sees an async def through a partial)
        self.remote = (RemoteRewardModel(cfg.rm_url, cfg.rm_concurrency, cfg.rm_timeout_s, cfg.rm_max_retries,
                                         cfg.rm_retry_backoff_s, cfg.rm_on_failure, cfg.rm_failure_score,
                                         cfg.rm_max_response_bytes, headers_from_env(cfg.rm_headers))
                       if cfg.rm_url else None)
        self.time_s = 0.0
        self.invalid = 0  # rewards that were not finite numbers (reward/invalid_rewards)

    def score(self, samples: list[Sample]) -> None:
        run_sync(self.score_async(samples))

    async def score_async(self, samples: list[Sample]) -> None:
        """`score` from inside a running event loop (the rollout collector scores groups as they finish)."""
        t0 = time.perf_counter()
        raw = await self._raw(samples)
        for s, r in zip(samples, raw):
            if isinstance(r, dict):
                s.metadata["reward_dict"] = r
            s.reward = self._checked(s, r)
        self.time_s += time.perf_counter() - t0

    def _checked(self, s: Sample, raw: Any) -> float:
        """The sample's reward as a finite float; an invalid one is a reward failure (module docstring)."""
        try:
            return reward_value(raw, self.reward_key)
        except ValueError as e:
            why = str(e)
        self.invalid += 1
        source = f"custom_rm {self.cfg.custom_rm['_target_']}" if self.custom is not None else f"rm_type={self._rm_type(s)}"
        if self.cfg.rm_on_failure == "raise":
            raise RunError(f"reward: {source} gave sample {s.index} the reward {why}; only finite numbers train. Fix the "
                           f"reward function, or set reward.rm_on_failure=zero to score such samples "
                           f"reward.rm_failure_score={self.cfg.rm_failure_score:g} and count them in {INVALID}")
        if self.invalid <= WARN_FIRST:
            log.warning("reward: %s gave sample %s the reward %s; scored reward.rm_failure_score=%g instead "
                        "(reward.rm_on_failure=zero; counted in %s)", source, s.index, why, self.cfg.rm_failure_score, INVALID)
        return float(self.cfg.rm_failure_score)

    async def _raw(self, samples: list[Sample]) -> list:
        if self.custom is not None:
            return await self._custom(samples)
        out: list = [None] * len(samples)
        remote_idx = [i for i, s in enumerate(samples) if self._rm_type(s) == "remote_rm"]
        for i, s in enumerate(samples):
            if self._rm_type(s) != "remote_rm":
                out[i] = verifier(self._rm_type(s))(s.response, s.label)
        if remote_idx:
            if self.remote is None:
                raise UserError(f"sample {samples[remote_idx[0]].index} asks for rm_type=remote_rm in its metadata; "
                                "set reward.rm_url")
            scored = await self.remote.score_all([samples[i] for i in remote_idx])
            for i, r in zip(remote_idx, scored):
                out[i] = r
        return out

    async def _custom(self, samples: list[Sample]) -> list:
        """custom_rm within reward.custom_rm_timeout_s. An async function is awaited with that deadline; a sync
        one runs with it too (samples in order, the event loop waiting, exactly as an inline call would)."""
        f, t = self.custom, self.cfg.custom_rm_timeout_s
        call = (lambda: f(samples)) if self.cfg.group_rm else (lambda: [f(s) for s in samples])
        try:
            if inspect.iscoroutinefunction(f):
                return list(await asyncio.wait_for(call() if self.cfg.group_rm else asyncio.gather(*call()), t))
            got = call_with_deadline(call, t)
        except (TimeoutError, asyncio.TimeoutError):
            raise RunError(f"reward: custom_rm {self.cfg.custom_rm['_target_']} did not return within "
                           f"reward.custom_rm_timeout_s={t:g} s for {len(samples)} samples; raise "
                           "reward.custom_rm_timeout_s if it is only slow") from None
        if self.cfg.group_rm:
            return list(await _maybe_await(got))
        return list(await asyncio.gather(*(_maybe_await(r) for r in got)))

    def _rm_type(self, s: Sample) -> str:
        return s.metadata.get("rm_type") or self.cfg.rm_type

    def metrics(self) -> dict[str, float]:
        out = {"perf/reward_time_s": self.time_s, INVALID: float(self.invalid)}
        if self.remote is not None:
            out |= {k: float(v) for k, v in self.remote.counters.items()}
        self.time_s = 0.0
        return out
