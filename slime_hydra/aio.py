"""Run a coroutine to completion from synchronous code, on one event loop per thread, reused.

`asyncio.run` makes a new loop and installs a SIGINT handler on every call; in the CPU default that
costs ~5 ms per rollout (the handler's enum conversion formats the repr of the running task, whose
arguments are the rollout's samples). The engine calls into async code a few times per rollout, so
it keeps one loop per thread instead. As `asyncio.run` does, tasks left pending when the coroutine
returns are cancelled, so nothing leaks into the next call.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")
_local = threading.local()


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
