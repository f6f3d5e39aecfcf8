"""`rm_type=remote_rm`: POST {prompt, response, label} to `rm_url`, concurrently, with a bound.

Each request has a timeout and bounded retries with exponential backoff. A request that still
fails either scores `rm_failure_score` (counted in `reward/remote_failures`) or stops the run
(`rm_on_failure=raise`). Retries are counted in `reward/remote_retries`.

The client trusts the server with nothing but scores:
- an answer is read up to `reward.rm_max_response_bytes` (after any decompression) and no further, so a server
  that streams without end cannot fill the driver's memory; a longer one is a failure;
- redirects are not followed (one would re-send every prompt and label to wherever it points); a 3xx is a failure;
- the URL is http or https (checked at validation, rewards/checks.py), and proxies in the environment are ignored;
- credentials travel in headers, never in the URL: `reward.rm_headers` maps a header to the environment variable
  that holds its value (`{Authorization: RM_AUTH}` sends $RM_AUTH), read when the scorer is built, so the secret
  is in no config, log or MLflow param.
A refused answer (too long, a redirect) is not retried: the server would give it again.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Mapping

from slime_hydra.errors import UserError
from slime_hydra.types import Sample

CHUNK = 64 * 1024


class RemoteRewardError(UserError):
    pass


class Refused(Exception):
    """An answer retrying would not change: too long, or a redirect."""


def headers_from_env(rm_headers: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """reward.rm_headers (header -> environment variable) -> the headers to send. The variables were checked at
    validation; one unset since is a UserError naming it."""
    missing = [f"{h} (${v})" for h, v in rm_headers.items() if v not in environ]
    if missing:
        raise UserError(f"reward.rm_headers: {', '.join(missing)} not set in the environment; export each variable")
    return {h: environ[v] for h, v in rm_headers.items()}


async def read_limited(resp, limit: int) -> bytes:
    """The body of `resp` (aiohttp), at most `limit` bytes; Refused as soon as it is longer."""
    if resp.content_length is not None and resp.content_length > limit:
        raise Refused(f"answer of {resp.content_length} bytes (Content-Length) is over reward.rm_max_response_bytes={limit}")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(CHUNK):
        body += chunk
        if len(body) > limit:
            raise Refused(f"answer longer than reward.rm_max_response_bytes={limit} bytes; read no further")
    return bytes(body)


@dataclass
class RemoteRewardModel:
    url: str
    concurrency: int = 64
    timeout_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 0.5
    on_failure: str = "zero"  # zero | raise
    failure_score: float = 0.0
    max_response_bytes: int = 1 << 20
    headers: dict[str, str] = field(default_factory=dict)  # resolved values (headers_from_env), never logged
    counters: dict = field(default_factory=lambda: {"reward/remote_retries": 0, "reward/remote_failures": 0})

    async def score_all(self, samples: list[Sample]) -> list:
        import aiohttp

        sem = asyncio.Semaphore(self.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
            return await asyncio.gather(*(self._one(session, sem, s) for s in samples))

    async def _post(self, session, payload: dict):
        """The parsed answer; Refused for one to give up on, any other exception for one to retry."""
        async with session.post(self.url, json=payload, headers=self.headers, allow_redirects=False) as resp:
            if 300 <= resp.status < 400:
                raise Refused(f"HTTP {resp.status} redirect to {resp.headers.get('Location')!r} refused (it would re-send "
                              "the sample elsewhere); point reward.rm_url at the address that answers")
            if resp.status != 200:
                raise OSError(f"HTTP {resp.status}")
            body = await read_limited(resp, self.max_response_bytes)
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as e:
            raise Refused(f"answer is not JSON ({type(e).__name__}: {str(e)[:100]})") from None

    async def _one(self, session, sem: asyncio.Semaphore, s: Sample):
        payload = {"prompt": s.prompt, "response": s.response, "label": s.label}
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.counters["reward/remote_retries"] += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                async with sem:
                    return await self._post(session, payload)
            except Refused as e:
                last_error = str(e)
                break
            except (asyncio.TimeoutError, OSError, Exception) as e:  # noqa: BLE001 - any transport error retries
                last_error = f"{type(e).__name__}: {e}"
        self.counters["reward/remote_failures"] += 1
        if self.on_failure == "raise":
            raise RemoteRewardError(f"reward.rm_url={self.url}: sample {s.index} failed after {attempt} retries "
                                    f"({last_error}); fix the server or set reward.rm_on_failure=zero")
        return self.failure_score
