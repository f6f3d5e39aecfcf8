"""Scores samples: per-sample `metadata.rm_type`, a custom `_target_`, a group reward, or a remote RM.

A reward may be a float or a dict; `reward_key` picks the scalar that trains (the dict is kept in
`sample.metadata["reward_dict"]`). Sync and async custom functions are both accepted.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Optional

from slime_hydra.aio import run_sync
from slime_hydra.config.schema import RewardConfig
from slime_hydra.errors import UserError
from slime_hydra.rewards.remote import RemoteRewardModel
from slime_hydra.rewards.verifiers import verifier
from slime_hydra.types import Sample


def reward_value(reward: Any, key: Optional[str]) -> float:
    if isinstance(reward, dict):
        if key is None:
            raise ValueError(f"dict reward {sorted(reward)} needs reward.reward_key")
        return float(reward[key])
    return float(reward)


async def _maybe_await(x):
    return await x if inspect.isawaitable(x) else x


class RewardScorer:
    """Built once per run from the reward config; `score(samples)` fills `sample.reward` in place."""

    def __init__(self, cfg: RewardConfig, reward_key: Optional[str] = None):
        self.cfg = cfg
        self.reward_key = reward_key if reward_key is not None else cfg.reward_key
        self.custom = None
        if cfg.custom_rm:
            from hydra.utils import get_method

            self.custom = get_method(cfg.custom_rm["_target_"])
            self.custom_kwargs = {k: v for k, v in cfg.custom_rm.items() if k != "_target_"}
        self.remote = (RemoteRewardModel(cfg.rm_url, cfg.rm_concurrency, cfg.rm_timeout_s, cfg.rm_max_retries,
                                         cfg.rm_retry_backoff_s, cfg.rm_on_failure, cfg.rm_failure_score)
                       if cfg.rm_url else None)
        self.time_s = 0.0

    def score(self, samples: list[Sample]) -> None:
        run_sync(self.score_async(samples))

    async def score_async(self, samples: list[Sample]) -> None:
        """`score` from inside a running event loop (the rollout collector scores groups as they finish)."""
        t0 = time.perf_counter()
        raw = await self._raw(samples)
        for s, r in zip(samples, raw):
            if isinstance(r, dict):
                s.metadata["reward_dict"] = r
            s.reward = reward_value(r, self.reward_key)
        self.time_s += time.perf_counter() - t0

    async def _raw(self, samples: list[Sample]) -> list:
        if self.custom is not None and self.cfg.group_rm:
            return list(await _maybe_await(self.custom(samples, **self.custom_kwargs)))
        if self.custom is not None:
            return list(await asyncio.gather(*(_maybe_await(self.custom(s, **self.custom_kwargs)) for s in samples)))
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

    def _rm_type(self, s: Sample) -> str:
        return s.metadata.get("rm_type") or self.cfg.rm_type

    def metrics(self) -> dict[str, float]:
        out = {"perf/reward_time_s": self.time_s}
        if self.remote is not None:
            out |= {k: float(v) for k, v in self.remote.counters.items()}
        self.time_s = 0.0
        return out
