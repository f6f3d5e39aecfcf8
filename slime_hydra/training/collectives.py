"""What a torch trainer's optimizer step reduces over its data-parallel ranks: the step's loss denominators and the
gradients.

One process reduces nothing (ONE_PROCESS); data-parallel ranks all-reduce both (training/distributed.DataParallel), so
every rank's step is the whole step's. The trainer and its critic take one of these; nothing is subclassed for it.
(megatron's trainer reduces over megatron's own groups: training/megatron/runner.py.)
"""

from __future__ import annotations

from typing import Protocol

import torch


class Collectives(Protocol):
    def sum(self, value: float) -> float:
        """`value` summed over the data-parallel ranks (a step's aggregation denominator)."""
        ...

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Before the optimizer step: each parameter's gradient <- its sum over the data-parallel ranks."""
        ...


class OneProcess:
    def sum(self, value: float) -> float:
        return value

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        pass


ONE_PROCESS = OneProcess()
