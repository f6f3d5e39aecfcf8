"""Weights sent from the train ranks to the SGLang engines colocated with them (`weight_sync=tensor` under Ray).

The driver route (train_group.WeightsRef) copies rank 0's weights to the CPU, through the object store to the driver,
and hands the engines shared-memory handles of that copy. slime's colocated route keeps them where they are: each
rank holds its full (TP-gathered) Hugging Face tensors on its own device, and the engine on that device gets handles
to them (CUDA IPC on a GPU, shared-memory files on CPU). An engine of `rollout_num_gpus_per_engine` > 1 GPUs gets one
payload per engine TP rank, each from the train rank on that GPU. The driver still pauses, flushes and continues
each engine and posts the payloads (HTTP on the loopback: the engines share the driver's node), bucket by bucket.

`RankStage` is the rank's half (a mixin of the rank actors): `stage_weights` is a collective of every rank (the TP
gather) and keeps the tensors until the next stage; `weight_payload` serialises one bucket and keeps it alive
until `drop_payload`. `RankWeights` is the driver's half, a rollout/sglang/weights.TensorSource: the rollout stages
it when it sends from tensors; iterating it falls back to the object-store route (what the disk, distributed and
local-engine routes read), and nothing is staged then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Optional

import torch

from slime_hydra.rollout.sglang import weights as W

if TYPE_CHECKING:  # not at run time: `slime-hydra plan` reads engine_ranks without importing ray
    from slime_hydra.orchestration.calls import RayCalls


class RankStage:
    """The rank side; the class using it has `self.trainer` with named_weights() (this stage's HF tensors, TP-gathered)."""

    _staged: tuple = ()  # (name, tensor) pairs, set by stage_weights
    _buckets: Optional[list] = None
    _kept: Optional[dict] = None  # bucket index -> what its handles point to

    def stage_weights(self) -> int:
        """Collective (every TP rank joins the gather): this rank's full HF tensors, on its device -> their count."""
        self._staged = tuple(self.trainer.named_weights())
        self._buckets, self._kept = None, {}
        return len(self._staged)

    def weight_payload(self, index: int, buffer_bytes: int, dtype: str) -> tuple[str, Optional[str], int]:
        """Bucket `index`'s handles -> (payload, load_format, number of buckets); alive until drop_payload(index)."""
        if self._buckets is None:
            self._buckets = list(W.buckets(self._staged, buffer_bytes, W.DTYPES[dtype]))
        payload, load_format, keep = W.serialize_bucket(self._buckets[index], W.DTYPES[dtype])
        self._kept[index] = keep
        return payload, load_format, len(self._buckets)

    def drop_payload(self, index: int) -> None:
        self._kept.pop(index, None)

    def check_weights(self, url: str, dtype: str, timeout: float) -> int:
        return W.check_equal(url, self._staged, dtype, timeout)


class RankWeights:
    """TensorSource over the ranks' staged weights. engine_ranks[e]: the ranks on engine e's bundles, in the engine's
    TP order. fallback(): the object-store route (a train_group.WeightsRef), for whoever iterates."""

    def __init__(self, ranks: list, engine_ranks: list[list[int]], calls: RayCalls, fallback: Callable[[], object]):
        self.ranks, self.engine_ranks, self.calls, self._fallback = ranks, engine_ranks, calls, fallback

    def stage(self) -> None:
        """Every rank (a collective: megatron's TP gather) stages its tensors on its device."""
        self.calls.get([r.stage_weights.remote() for r in self.ranks], "staging the weights",
                       [f"rank {r}" for r in range(len(self.ranks))])

    def _labels(self, engine: int) -> list[str]:
        return [f"rank {r}" for r in self.engine_ranks[engine]]

    def _payloads(self, engine: int, buffer_bytes: int, dtype: str) -> Iterator[tuple[list[str], Optional[str]]]:
        ranks = [self.ranks[r] for r in self.engine_ranks[engine]]
        index, count = 0, 1
        while index < count:
            got = self.calls.get([r.weight_payload.remote(index, buffer_bytes, dtype) for r in ranks],
                                 f"weight handles for sglang engine {engine}", self._labels(engine))
            count = got[0][2]
            yield [payload for payload, _, _ in got], got[0][1]  # the engine has read the bucket when this resumes
            self.calls.get([r.drop_payload.remote(index) for r in ranks], "releasing a weight bucket", self._labels(engine))
            index += 1

    def send(self, engine: int, url: str, version: int, tp_size: int, buffer_bytes: int, dtype: str, timeout: float) -> int:
        assert len(self.engine_ranks[engine]) == tp_size, (self.engine_ranks, tp_size)
        return W.update_from_payloads(url, self._payloads(engine, buffer_bytes, dtype), version, timeout)

    def check_equal(self, engine: int, url: str, dtype: str, timeout: float) -> int:
        first = self.engine_ranks[engine][0]
        return self.calls.get(self.ranks[first].check_weights.remote(url, dtype, timeout), "check_weight_update_equal",
                              [f"rank {first}"])

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._fallback())

    @property
    def ref(self):
        """The object-store reference a rollout manager of local engines hands on (train_group.WeightsRef.ref)."""
        return self._fallback().ref


def engine_ranks(actor_bundles: tuple[int, ...], engine_bundles: tuple[tuple[int, ...], ...],
                 pipeline_stages: int = 1) -> Optional[list[list[int]]]:
    """The train rank on each of each engine's bundles, or None where the ranks cannot send: an engine has a bundle
    with no train rank (the engines are not colocated with the ranks), or the model is split into pipeline stages (a
    rank holds its stage's layers only)."""
    rank_of = {b: r for r, b in enumerate(actor_bundles)}
    if pipeline_stages > 1 or any(b not in rank_of for bundles in engine_bundles for b in bundles):
        return None
    return [[rank_of[b] for b in bundles] for bundles in engine_bundles]
