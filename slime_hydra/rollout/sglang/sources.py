"""Where the trainer's tensors are when an engine gets them, and how they reach it from there (a TensorSource).

`LocalTensors`: this process's tensors (one process, or the driver's copy from the object store): handles posted
from here (`weights`), or this process as rank 0 of the engine's update group (`distributed`). Under Ray the train
ranks are sources themselves (orchestration/rank_weights.RankWeights): colocated ranks post handles to their own
tensors, and a rank per engine opens its update group and broadcasts (NCCL from its GPU, gloo on CPU). The rollout
(backend.SGLangRollout) asks a source whether it `serves` the route, stages it, and calls `send` / `broadcast`
inside its own pause / flush / continue; it never asks where the tensors are. Disk sync reads the tensors here.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Protocol, runtime_checkable

import torch

from slime_hydra.protocols import copied_weights
from slime_hydra.rollout.sglang import distributed as D
from slime_hydra.rollout.sglang import weights as W


@runtime_checkable
class TensorSource(Protocol):
    """Weights that reach an engine from where they live. Iterating gives the named tensors themselves (here)."""

    def serves(self, route: str) -> bool:
        """Whether it sends by `route` ("tensor": send, "distributed": broadcast) itself; if not, the rollout iterates it."""

    def stage(self) -> None:
        """Make the tensors ready where they live, once per sync, before any send (the ranks' gather); nothing when
        snapshot() did it already."""
        ...

    def snapshot(self) -> None:
        """stage() now, into a copy that training no longer changes (train_mode=async sends it later)."""

    def send(self, engine: int, url: str, version: int, tp_size: int, buffer_bytes: int, dtype: str, timeout: float) -> int:
        """Engine `engine` at `url` (paused by the caller) gets every bucket as tensor handles; -> the number of requests."""

    def broadcast(self, engine: int, url: str, launch: int, version: int, tp_size: int, buffer_bytes: int, dtype: str,
                  timeout: float) -> int:
        """Engine `engine` at `url` (paused; its `launch`-th server) gets every bucket over its update group, opened by
        whoever holds the tensors (a new group for a new launch); -> the number of requests."""

    def check_equal(self, engine: int, url: str, dtype: str, timeout: float) -> int:
        """check_equal against the engine, where the tensors are; -> the number of tensors compared."""

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...


class LocalTensors:
    """TensorSource of this process's tensors. groups: this process's update groups (the rollout keeps them across
    syncs); needed by `broadcast` only."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], groups: Optional[D.UpdateGroups] = None):
        self.tensors = list(named_tensors)
        self.groups = groups

    def serves(self, route: str) -> bool:
        return route == "tensor" or (route == "distributed" and self.groups is not None)

    def stage(self) -> None:
        pass  # they are here

    def snapshot(self) -> None:
        self.tensors = copied_weights(self.tensors)

    def send(self, engine: int, url: str, version: int, tp_size: int, buffer_bytes: int, dtype: str, timeout: float) -> int:
        return W.update_from_tensors(url, self.tensors, version, tp_size, buffer_bytes, dtype, timeout)

    def broadcast(self, engine: int, url: str, launch: int, version: int, tp_size: int, buffer_bytes: int, dtype: str,
                  timeout: float) -> int:
        assert self.groups is not None, "LocalTensors.broadcast needs the process's UpdateGroups"
        return self.groups.send(engine, url, launch, self.tensors, version, tp_size, buffer_bytes, dtype, timeout)

    def check_equal(self, engine: int, url: str, dtype: str, timeout: float) -> int:
        return W.check_equal(url, self.tensors, dtype, timeout)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.tensors)
