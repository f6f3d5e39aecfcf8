"""`rm_type=remote_rm`: POST {prompt, response, label} to `rm_url`, concurrently, with a bound.

Each request has a timeout and bounded retries with exponential backoff. A request that still
fails either scores `rm_failure_score` (counted in `reward/remote_failures`) or stops the run
(`rm_on_failure=raise`). Retries are counted in `reward/remote_retries`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from slime_hydra.errors import UserError
from slime_hydra.types import Sample


class RemoteRewardError(UserError):
    pass


@dataclass
class RemoteRewardModel:
    url: str
    concurrency: int = 64
    timeout_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 0.5
    on_failure: str = "zero"  # zero | raise
    failure_score: float = 0.0
    counters: dict = field(default_factory=lambda: {"reward/remote_retries": 0, "reward/remote_failures": 0})

    async def score_all(self, samples: list[Sample]) -> list:
        import aiohttp

        sem = asyncio.Semaphore(self.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            return await asyncio.gather(*(self._one(session, sem, s) for s in samples))

    async def _one(self, session, sem: asyncio.Semaphore, s: Sample):
        payload = {"prompt": s.prompt, "response": s.response, "label": s.label}
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.counters["reward/remote_retries"] += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                async with sem, session.post(self.url, json=payload) as resp:
                    if resp.status == 200:
                        return await resp.json()
                    last_error = f"HTTP {resp.status}"
            except (asyncio.TimeoutError, OSError, Exception) as e:  # noqa: BLE001 - any transport error retries
                last_error = f"{type(e).__name__}: {e}"
        self.counters["reward/remote_failures"] += 1
        if self.on_failure == "raise":
            raise RemoteRewardError(f"reward.rm_url={self.url}: sample {s.index} failed after {self.max_retries} retries "
                                    f"({last_error}); fix the server or set reward.rm_on_failure=zero")
        return self.failure_score
