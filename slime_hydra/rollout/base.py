"""The rollout Protocol every backend implements."""

from __future__ import annotations

from typing import Iterable, Protocol

import torch

from slime_hydra.types import Sample, SamplingParams


class RolloutBackend(Protocol):
    weight_version: int

    async def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Sample]:
        """Fill tokens, response, response_length, rollout_log_probs, status, weight_version."""
        ...

    def abort(self) -> None:
        """Stop the generate() in progress soon: unfinished samples return with the response so far and
        status ABORTED (a later generate() continues them from their tokens). Safe to call when idle."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...

    def metrics(self) -> dict[str, float]:
        """The backend's own figures (`section/name` -> value: sync timings, request and retry counts),
        logged with every rollout step; what belongs to one weight sync is reported once; {} if none."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def shutdown(self) -> None: ...
