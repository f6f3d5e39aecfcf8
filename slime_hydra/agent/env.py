"""The tool/environment Protocol and the one place a tool is called: errors become counted observations.

A tool call is the text between the tool-call markers of a model turn. Whatever the tool does wrong
(raises, hangs past its timeout, rejects a malformed call) ends that turn with an error observation
the model reads, and is counted in the sample's metadata; it never ends the run. A sync `step` that
hangs runs on in its worker thread after the timeout (Python cannot kill a thread); an async one is
cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from slime_hydra.types import Sample


class ToolError(Exception):
    """Raised by an environment for a call it cannot run (malformed arguments, unknown tool)."""


@dataclass
class StepResult:
    observation: str  # text appended (as observation tokens, masked from the loss) before the next model turn
    reward: float = 0.0  # accumulated into sample.metadata["env_reward"]; the reward function sees it
    done: bool = False  # True: the episode ends after this observation


class ToolEnv(Protocol):
    """One environment per sample. `reset` and `step` may be sync or async."""

    def reset(self, sample: Sample) -> None: ...

    def step(self, call: str) -> StepResult: ...


async def maybe_await(x: Any) -> Any:
    return await x if inspect.isawaitable(x) else x


async def run_step(env: ToolEnv, call: Optional[str], timeout_s: float) -> tuple[StepResult, Optional[str]]:
    """(result, error kind or None). `call` None means the model closed a call it never opened."""
    if call is None:
        return StepResult("error: malformed call"), "malformed"
    try:
        if inspect.iscoroutinefunction(env.step):
            result = await asyncio.wait_for(env.step(call), timeout_s)
        else:
            result = await asyncio.wait_for(asyncio.to_thread(env.step, call), timeout_s)
    except ToolError:
        return StepResult("error: malformed call"), "malformed"
    except asyncio.TimeoutError:
        return StepResult("error: timeout"), "timeout"
    except Exception:  # noqa: BLE001 - a failing tool is an observation for the model, not a crash
        return StepResult("error: tool failed"), "exception"
    if not isinstance(result, StepResult):
        return StepResult("error: tool failed"), "exception"
    return result, None
