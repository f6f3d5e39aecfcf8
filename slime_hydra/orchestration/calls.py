"""Every wait on a Ray actor has a deadline: `get` is `ray.get` that names what it waited for when it fails.

A call that does not finish within `cluster.ray_call_timeout_s` (a rank stuck in a collective, a deadlock in
an engine, a device that stopped answering) and a call whose actor died (OOM killer, segfault, node lost)
both become a RunError (exit code 3) naming the step, the actor ("train step on rank 1"), the key and where
to resume; the driver does not sit in `ray.get` forever. A RunError raised inside an actor (the rollout
manager's own waits on its engines, a rank's collective timeout) reaches the driver as that message, not a
remote traceback. Other exceptions raised by actor code pass through unchanged: they are bugs, and their
traceback is what explains them.

The waits go one reference at a time (`ray.wait`), so the first failure ends the wait: a dead rank 1 is
reported at once even while rank 0 sits in an all-reduce waiting for it. A rank whose collective fails is often the
echo of a peer that died (gloo closes the pair), and which of the two reaches the driver first is a race: so an
actor's own error waits up to DEATH_GRACE_S for the other calls, and a peer's death, the cause, is what is reported.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Callable, Optional, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from slime_hydra.errors import RunError

KEY = "cluster.ray_call_timeout_s"
GENERIC_HINT = "Resume from the last checkpoint with load=<the run's save root>."


def outer_timeout_s(timeout_s: float) -> float:
    """The driver's deadline on an actor call that itself waits on other actors with `timeout_s` (the rollout
    manager on its engines): a little longer, so the inner wait fires first and names the engine."""
    return timeout_s + 5.0 + min(0.1 * timeout_s, 60.0)


def _hint(resume_hint: Optional[Callable[[], str]]) -> str:
    if resume_hint is None:
        return ""
    try:
        return " " + resume_hint()
    except Exception:  # noqa: BLE001 - the failure being reported matters more than the hint
        return " " + GENERIC_HINT


def _died(e: RayActorError) -> str:
    """The useful part of Ray's dead-actor message: why it died, and its pid, without the id lines."""
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines() if ln.strip()]
    if e.actor_init_failed:  # the message holds the creation task's traceback: its last line says what was raised
        return f"its creation task (__init__) raised {lines[-1][:300] if lines else 'an error'}"
    pid = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("pid:")), None)
    keep = [ln for ln in lines if ":" not in ln.split(" ")[0] and not ln.startswith(("The actor died unexpectedly",
                                                                                       "The actor experienced"))]
    why = " ".join(keep)[:300] or "no reason given"
    return f"{why}{f' (pid {pid})' if pid else ''}"


def _failure(e: BaseException, what: str, label: str, hint: str) -> Optional[RunError]:
    """The RunError a failed reference turns into, or None for an error that should pass through unchanged."""
    where = f"{what} on {label}" if label else what
    if isinstance(e, RayActorError):
        return RunError(f"{where}: the actor died: {_died(e)}. The run cannot continue without it (a crash, the OOM "
                        f"killer, a lost node: its log is in the Ray session's logs directory).{hint}")
    if isinstance(e, RayTaskError) and isinstance(e.cause, RunError):  # the actor's own deadline fired: its message
        return RunError(f"{e.cause}{hint}")
    return None


def get(refs: Any, what: str, timeout_s: float, labels: Optional[Sequence[str]] = None, key: str = KEY,
        resume_hint: Optional[Callable[[], str]] = None) -> Any:
    """`ray.get(refs)` within `timeout_s` seconds (one deadline for all of them).

    refs: one ObjectRef, or a list (then `labels` names the actor of each, e.g. ["rank 0", "rank 1"]).
    what: the step, as the message should name it ("train step", "weight sync"). resume_hint: where the run
    resumes from (the driver passes it; an actor leaves it out and the driver adds it when the error reaches it).
    """
    single = not isinstance(refs, (list, tuple))
    todo = [refs] if single else list(refs)
    names = list(labels) if labels is not None else [""] * len(todo) if single else [f"actor {i}" for i in range(len(todo))]
    hint = _hint(resume_hint)
    label_of = {r: n for r, n in zip(todo, names)}
    pending, deadline = list(todo), time.monotonic() + timeout_s
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready and time.monotonic() < deadline:  # ray.wait may return a little before its timeout
            continue
        if not ready:
            stuck = ", ".join(label_of[r] for r in pending)
            done = len(todo) - len(pending)
            where = f"{what} on {stuck}" if stuck else what
            raise RunError(f"{where} did not finish within {key}={timeout_s:g} s"
                           f"{f' ({done} of {len(todo)} finished)' if done else ''}: the actor is alive but stuck or "
                           f"slow (a hung collective or device, a deadlock). Raise {key} if the step is only slow.{hint}")
        for r in ready:  # an error ends the wait at once, naming its actor
            try:
                ray.get(r, timeout=0)
            except (RayActorError, RayTaskError) as e:
                err = _failure(e, what, label_of[r], hint)
                if err is None:
                    raise
                if not isinstance(e, RayActorError):
                    err = _peer_death(pending, what, label_of, hint) or err
                raise err from None
    try:
        out = ray.get(todo, timeout=max(1.0, deadline - time.monotonic()))  # all ready: returns at once
    except GetTimeoutError:  # not expected: every reference was ready
        raise RunError(f"{what}: results did not arrive within {key}={timeout_s:g} s.{hint}") from None
    return out[0] if single else out


# A killed actor's death reaches the driver through the GCS: on a busy two-core machine it had not arrived 2 s after
# its peer's failed collective (tests/orchestration/test_timeouts.py), and once, with the whole tier running beside it, not
# within 5 s. The wait ends as soon as a peer's death arrives; only an error with no dead peer waits it out.
DEATH_GRACE_S = 10.0


def _peer_death(pending: list, what: str, label_of: dict, hint: str) -> Optional[RunError]:
    """The death of another actor of the same call within DEATH_GRACE_S, if one died: the cause to report."""
    deadline = time.monotonic() + DEATH_GRACE_S
    while pending and time.monotonic() < deadline:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        for r in ready:
            try:
                ray.get(r, timeout=0)
            except RayActorError as e:
                return _failure(e, what, label_of[r], hint)
            except Exception:  # noqa: BLE001 - another rank's own error: the first one stands
                pass
    return None


async def get_async(ref: Any, what: str, timeout_s: float, label: str = "", key: str = KEY,
                    resume_hint: Optional[Callable[[], str]] = None) -> Any:
    """`await ref` within `timeout_s` seconds, failing as `get` does (for a call made from a coroutine)."""
    hint = _hint(resume_hint)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)
    except asyncio.TimeoutError:
        where = f"{what} on {label}" if label else what
        raise RunError(f"{where} did not finish within {key}={timeout_s:g} s: the actor is alive but stuck or slow "
                       f"(a hung device, a deadlock). Raise {key} if the step is only slow.{hint}") from None
    except (RayActorError, RayTaskError) as e:
        err = _failure(e, what, label, hint)
        if err is None:
            raise
        raise err from None


class RayCalls:
    """The driver's calls: one timeout and one resume hint for all of them."""

    def __init__(self, timeout_s: float, resume_hint: Optional[Callable[[], str]] = None):
        self.timeout_s, self.resume_hint = timeout_s, resume_hint or (lambda: GENERIC_HINT)

    def get(self, refs: Any, what: str, labels: Optional[Sequence[str]] = None, nested: bool = False) -> Any:
        """nested: the actor itself waits on others with the same timeout (see outer_timeout_s)."""
        t = outer_timeout_s(self.timeout_s) if nested else self.timeout_s
        return get(refs, what, t, labels, resume_hint=self.resume_hint)

    async def get_async(self, ref: Any, what: str, label: str = "", nested: bool = False) -> Any:
        t = outer_timeout_s(self.timeout_s) if nested else self.timeout_s
        return await get_async(ref, what, t, label, resume_hint=self.resume_hint)

    def shutdown(self, refs: Any, what: str, labels: Optional[Sequence[str]] = None) -> None:
        """A shutdown call that may not be answered (its actor is stuck in the call that failed): a short wait,
        then nothing; the caller kills the actors anyway. Never raises over the error that is ending the run."""
        try:
            get(refs, what, min(self.timeout_s, SHUTDOWN_WAIT_S), labels)
        except Exception:  # noqa: BLE001 - best effort, see above
            pass


SHUTDOWN_WAIT_S = 30.0
