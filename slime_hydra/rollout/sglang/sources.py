"""How the trainer's tensors reach an engine from where they are (a Sender), and the two routes that take them there.

The rollout (backend.SGLangRollout) asks the weights for their sender on its route (`Weights.sender(TENSOR)` or
`DISTRIBUTED`, slime_hydra/protocols.py). Under Ray the train ranks send their own (orchestration/rank_weights.
RankWeights): colocated ranks post handles to their own tensors, and a rank per engine opens its update group and
broadcasts (NCCL from its GPU, gloo on CPU). Weights that do not send themselves by the route are iterated into
`LocalTensors`, this process's tensors: handles posted from here (`tensor`), or this process as rank 0 of the engine's
update group (`distributed`). The rollout stages the sender and calls `send` / `broadcast` inside its own pause /
flush / continue; it never asks where the tensors are. Disk sync reads the tensors here.
"""

from __future__ import annotations

from typing import Iterable, Optional, Protocol

import torch

from slime_hydra.protocols import Route
from slime_hydra.rollout.sglang import distributed as D
from slime_hydra.rollout.sglang import weights as W
from slime_hydra.rollout.sglang.checks import weight_sync_mode
from slime_hydra.rollout.sglang.endpoint import Endpoint


class Sender(Protocol):
    """Sends the weights to an engine from where they live, by one route."""

    def stage(self) -> None:
        """Make the tensors ready where they live, once per sync, before any send (the ranks' gather); nothing when
        a snapshot did it already."""
        ...

    def send(self, engine: int, url: Endpoint, version: int, tp_size: int, buffer_bytes: int, dtype: str, timeout: float) -> int:
        """Engine `engine` at `url` (paused by the caller) gets every bucket as tensor handles; -> the number of requests."""
        ...

    def broadcast(self, engine: int, url: Endpoint, launch: int, version: int, tp_size: int, buffer_bytes: int, dtype: str,
                  timeout: float) -> int:
        """Engine `engine` at `url` (paused; its `launch`-th server) gets every bucket over its update group, opened by
        whoever holds the tensors (a new group for a new launch); -> the number of requests."""
        ...

    def check_equal(self, engine: int, url: Endpoint, dtype: str, timeout: float) -> int:
        """check_equal against the engine, where the tensors are; -> the number of tensors compared."""
        ...

    def to_host(self) -> "Sender":
        """What a later resync may send while the trainer's memory is released (cluster.offload_train): a copy in host
        memory, or this sender where its holders move their tensors to the host themselves."""
        ...


TENSOR: Route[Sender] = Route("tensor")  # handles to the tensors, posted to the engine that shares their device
DISTRIBUTED: Route[Sender] = Route("distributed")  # a broadcast over the engine's update group
ROUTES = {r.name: r for r in (TENSOR, DISTRIBUTED)}


def route_of(weight_sync: str, colocate: bool) -> Optional[Route[Sender]]:
    """The route of rollout.weight_sync (auto: by cluster.colocate); None for disk sync, which reads the tensors here."""
    return ROUTES.get(weight_sync_mode(weight_sync, colocate))


class LocalTensors:
    """Sender of this process's tensors. groups: this process's update groups (the rollout keeps them across syncs)."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], groups: D.UpdateGroups):
        self.tensors = list(named_tensors)
        self.groups = groups

    def stage(self) -> None:
        pass  # they are here

    def send(self, engine: int, url: Endpoint, version: int, tp_size: int, buffer_bytes: int, dtype: str, timeout: float) -> int:
        return W.update_from_tensors(url, self.tensors, version, tp_size, buffer_bytes, dtype, timeout)

    def broadcast(self, engine: int, url: Endpoint, launch: int, version: int, tp_size: int, buffer_bytes: int, dtype: str,
                  timeout: float) -> int:
        return self.groups.send(engine, url, launch, self.tensors, version, tp_size, buffer_bytes, dtype, timeout)

    def check_equal(self, engine: int, url: Endpoint, dtype: str, timeout: float) -> int:
        return W.check_equal(url, self.tensors, dtype, timeout)

    def to_host(self) -> "LocalTensors":
        return LocalTensors([(name, t.detach().to("cpu", copy=True)) for name, t in self.tensors], self.groups)
