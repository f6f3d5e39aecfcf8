"""A tracker whose failures never stop the run: each call is retried, then given up with a warning.

The checkpoint, the summary and every checkpoint's history hold a run's metrics whatever the tracker does; the
tracker is where they are looked at. So a call that fails (a tracking server down or restarting, a store locked)
is retried `retries` times with exponential backoff from `backoff_s`, then the run goes on: metric points not
logged are kept and sent again, oldest first, after the next call that succeeds; those still missing at the end are
reported (`missing_report`). While calls fail, each later one is tried once (no backoff), so an outage costs a
run one request per call, not `retries` backoffs per step.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from slime_hydra.protocols import Tracker

log = logging.getLogger(__name__)


def steps_text(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7"."""
    out, start = [], None
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ", ".join(out)


class RetryingTracker:
    def __init__(self, inner: Tracker, retries: int = 2, backoff_s: float = 1.0, sleep: Callable[[float], None] = time.sleep):
        self.inner, self.retries, self.backoff_s, self.sleep = inner, retries, backoff_s, sleep
        self.failing = False  # the last call failed: later ones are tried once until one succeeds
        self.missing: list[tuple[int, dict[str, float]]] = []  # (step, metrics) not logged yet
        self.failed_calls = 0
        self.first_error: Optional[str] = None

    @property
    def run_id(self) -> Optional[str]:
        return self.inner.run_id

    def _call(self, what: str, fn: Callable[[], None]) -> bool:
        tries = 1 if self.failing else self.retries + 1
        for i in range(tries):
            if i:
                self.sleep(self.backoff_s * 2 ** (i - 1))
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - any tracker failure is downgraded (module docstring)
                error = f"{type(e).__name__}: {str(e).strip()[:300]}"
                continue
            if self.failing:
                log.warning("tracker: working again (%s)", what)
            self.failing = False
            return True
        self.failed_calls += 1
        self.first_error = self.first_error or error
        if not self.failing:
            log.warning("tracker: %s failed after %d tries (%s); the run goes on, and the points not logged are sent again "
                        "once it works", what, tries, error)
        self.failing = True
        return False

    def _resend(self) -> None:
        """The points not logged yet, oldest first, until one fails (while failing: one try, which probes the tracker)."""
        while self.missing:
            step, metrics = self.missing[0]
            if not self._call(f"metrics of step {step}, sent again", lambda: self.inner.log_metrics(metrics, step)):
                return
            self.missing.pop(0)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._resend()
        if self.missing or not self._call(f"metrics of step {step}", lambda: self.inner.log_metrics(metrics, step)):
            self.missing.append((step, dict(metrics)))

    def log_params(self, params: dict[str, object]) -> None:
        self._call("params", lambda: self.inner.log_params(params))

    def set_tags(self, tags: dict[str, str]) -> None:
        self._call("tags", lambda: self.inner.set_tags(tags))

    def log_artifact(self, path: str, artifact_path: Optional[str] = None) -> None:
        self._call(f"artifact {path}", lambda: self.inner.log_artifact(path, artifact_path))

    def close(self, status: str = "FINISHED") -> None:
        self.failing = False  # a last full try: the outage may be over
        self._resend()
        self._call(f"closing the run as {status}", lambda: self.inner.close(status))

    def missing_report(self) -> Optional[str]:
        """What the tracker lacks at the end, and where the points are instead; None when nothing is missing."""
        if not self.missing and not self.failed_calls:
            return None
        steps = sorted({s for s, _ in self.missing})
        points = f"{len(steps)} metric points were not logged (steps {steps_text(steps)})" if steps else "every metric point was logged"
        return (f"tracker: {points}; {self.failed_calls} calls failed in all, the first with {self.first_error}. The run's "
                "metrics are in its summary.json and every checkpoint's history")
