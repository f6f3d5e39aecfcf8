"""cluster.offload_train in the loop: the trainer's memory is released while the engines generate, and back after.

Every generation the loop runs (a rollout, an eval, a warm-start check) goes inside `trainer_released`; every other
step (advantages, training, weight sync, checkpoints) runs with the trainer whole. The engines' own release
(cluster.offload_rollout) is the rollout backend's, around the same generation (rollout/sglang/backend.py).
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

from slime_hydra.protocols import TrainBackend


@contextlib.contextmanager
def trainer_released(trainer: TrainBackend, enabled: bool) -> Iterator[dict[str, float]]:
    """Yields the figures of the release (perf/offload_*), the resume's seconds added when the block ends."""
    figures: dict[str, float] = {}
    if not enabled:
        yield figures
        return
    t0 = time.perf_counter()
    figures |= trainer.release_memory()
    figures["perf/offload_release_s"] = time.perf_counter() - t0
    try:
        yield figures
    finally:
        t1 = time.perf_counter()
        trainer.resume_memory()
        figures["perf/offload_resume_s"] = time.perf_counter() - t1
