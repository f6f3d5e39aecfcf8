"""Weights sent to the SGLang engines by the train ranks themselves, under Ray (slime's routes).

The driver route (WeightsRef below) copies rank 0's weights to the CPU, through the object store to the driver,
which sends them. slime keeps them where they are: with PP=1 every rank holds its full (TP-gathered) Hugging Face
tensors on its own device after the gather, and sends from there:
- colocated engines (`weight_sync=tensor`): the engine on a rank's device gets handles to its tensors (CUDA IPC on a
  GPU, shared-memory files on CPU); an engine of `rollout_num_gpus_per_engine` > 1 GPUs gets one payload per engine TP
  rank, each from the train rank on that GPU. The driver posts the payloads (HTTP on the loopback), bucket by bucket.
- any engine over an update group (`weight_sync=distributed`, disaggregated): engine e is fed by rank e % ranks
  (`feeder_ranks`), which opens the engine's group as its rank 0 (NCCL from the rank's GPU, gloo on CPU; a new group
  when the engine is relaunched), posts each bucket's /update_weights_from_distributed from a thread and broadcasts
  (rollout/sglang/distributed.UpdateGroups). Engines fed by different ranks receive at the same time.
The driver still pauses, flushes and continues each engine. With PP>1 a rank holds its stage's layers only, and the
weights take the driver route (on GPUs, validation refuses the update group there: the driver has no GPU).

`RankStage` is the rank's half (a mixin of the rank actors): `stage_weights` is a collective of every rank (the TP
gather) and keeps the tensors until the next stage on the ranks that send them; `weight_payload` serialises one bucket
and keeps it alive until `drop_payload`; `broadcast_weights` feeds an engine's update group. `RankWeights` is the
driver's half, a rollout/sglang/sources.TensorSource: the rollout stages it when it `serves` the rollout's route;
otherwise (or when iterated) it falls back to the object-store route, and nothing is staged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Optional

import torch

from slime_hydra.rollout.sglang import distributed as D
from slime_hydra.rollout.sglang import weights as W

if TYPE_CHECKING:  # not at run time: `slime-hydra plan` reads engine_ranks without importing ray
    from slime_hydra.orchestration.calls import RayCalls


class RankStage:
    """The rank side; the class using it has `self.trainer` with named_weights() (this stage's HF tensors, TP-gathered)
    and `self.device` (its torch.device: the update groups' backend and tensors follow it)."""

    _staged: tuple = ()  # (name, tensor) pairs, set by stage_weights
    _buckets: Optional[list] = None
    _kept: Optional[dict] = None  # bucket index -> what its handles point to
    _update_groups: Optional[D.UpdateGroups] = None  # this rank's, one per engine it feeds

    def stage_weights(self, keep: bool = True, copy: bool = False) -> int:
        """Collective (every TP rank joins the gather): this rank's full HF tensors, on its device, kept if this rank
        sends them (copy: cloned, so that training goes on without changing them: train_mode=async) -> their count."""
        staged = tuple(self.trainer.named_weights())
        if copy and keep:
            staged = tuple((name, t.detach().clone()) for name, t in staged)
        self._staged = staged if keep else ()
        self._buckets, self._kept = None, {}
        return len(staged)

    def weight_payload(self, index: int, buffer_bytes: int, dtype: str) -> tuple[str, Optional[str], int]:
        """Bucket `index`'s handles -> (payload, load_format, number of buckets); alive until drop_payload(index)."""
        if self._buckets is None:
            self._buckets = list(W.buckets(self._staged, buffer_bytes, W.DTYPES[dtype]))
        payload, load_format, keep = W.serialize_bucket(self._buckets[index], W.DTYPES[dtype])
        self._kept[index] = keep
        return payload, load_format, len(self._buckets)

    def drop_payload(self, index: int) -> None:
        self._kept.pop(index, None)

    def broadcast_weights(self, engine: int, url: str, launch: int, version: int, tp_size: int, buffer_bytes: int,
                          dtype: str, timeout: float) -> int:
        """The staged tensors to engine `engine` over its update group, this rank its rank 0 -> the number of requests."""
        if self._update_groups is None:
            self._update_groups = D.UpdateGroups(self.device.type)
        assert self._staged, "broadcast_weights before stage_weights(keep=True)"
        return self._update_groups.send(engine, url, launch, list(self._staged), version, tp_size, buffer_bytes, dtype, timeout)

    def check_weights(self, url: str, dtype: str, timeout: float) -> int:
        return W.check_equal(url, self._staged, dtype, timeout)

    def staged_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The staged tensors, on the CPU (not a collective): what a snapshot's reader iterates."""
        return [(name, t.detach().cpu()) for name, t in self._staged]


class RankWeights:
    """TensorSource over the ranks' staged weights. engine_ranks[e]: the ranks on engine e's bundles, in the engine's TP
    order (None: not colocated). feeders[e]: the rank that broadcasts to engine e (None: PP>1). fallback(): the
    object-store route (a WeightsRef), for whoever iterates."""

    def __init__(self, ranks: list, engine_ranks: Optional[list[list[int]]], feeders: Optional[list[int]], calls: RayCalls,
                 fallback: Callable[[], object]):
        self.ranks, self.engine_ranks, self.feeders, self.calls, self._fallback = ranks, engine_ranks, feeders, calls, fallback
        self._staged = False  # staged for this sync: stage() does nothing more

    def serves(self, route: str) -> bool:
        return {"tensor": self.engine_ranks, "distributed": self.feeders}.get(route) is not None

    def _holders(self) -> set[int]:
        return {r for rs in self.engine_ranks or () for r in rs} | set(self.feeders or ())

    def stage(self) -> None:
        """Every rank (a collective: megatron's TP gather) stages its tensors on its device; those that send keep them."""
        self._stage(self._holders(), copy=False)

    def snapshot(self) -> None:
        """stage() now, into copies (training goes on before they are sent: train_mode=async); rank 0 keeps one too,
        which iterating (the routes the ranks do not serve) then reads instead of the ranks' live weights."""
        self._stage(self._holders() | {0}, copy=True)
        self._fallback = lambda: WeightsRef(self.ranks[0].staged_weights.remote(), self.calls)

    def _stage(self, holders: set[int], copy: bool) -> None:
        if self._staged:
            return
        self.calls.get([r.stage_weights.remote(i in holders, copy) for i, r in enumerate(self.ranks)], "staging the weights",
                       [f"rank {r}" for r in range(len(self.ranks))])
        self._staged = True

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

    def broadcast(self, engine: int, url: str, launch: int, version: int, tp_size: int, buffer_bytes: int, dtype: str,
                  timeout: float) -> int:
        r = self.feeders[engine]
        return self.calls.get(self.ranks[r].broadcast_weights.remote(engine, url, launch, version, tp_size, buffer_bytes, dtype,
                                                                     timeout),
                              f"broadcasting the weights to sglang engine {engine} over its update group", [f"rank {r}"])

    def check_equal(self, engine: int, url: str, dtype: str, timeout: float) -> int:
        r = self.engine_ranks[engine][0] if self.engine_ranks is not None else self.feeders[engine]
        return self.calls.get(self.ranks[r].check_weights.remote(url, dtype, timeout), "check_weight_update_equal", [f"rank {r}"])

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._fallback())

    @property
    def ref(self):
        """The object-store reference a rollout manager of local engines hands on (WeightsRef.ref)."""
        return self._fallback().ref


class WeightsRef:
    """rank 0's weights (or its snapshot) in the object store: iterating fetches them; a rollout manager takes `.ref` as is."""

    def __init__(self, ref, calls: RayCalls):
        self.ref, self.calls = ref, calls

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.calls.get(self.ref, "fetching the weights", ["rank 0"]))


def engine_ranks(actor_bundles: tuple[int, ...], engine_bundles: tuple[tuple[int, ...], ...],
                 pipeline_stages: int = 1) -> Optional[list[list[int]]]:
    """The train rank on each of each engine's bundles, or None where the ranks cannot send: an engine has a bundle
    with no train rank (the engines are not colocated with the ranks), or the model is split into pipeline stages (a
    rank holds its stage's layers only)."""
    rank_of = {b: r for r, b in enumerate(actor_bundles)}
    if pipeline_stages > 1 or any(b not in rank_of for bundles in engine_bundles for b in bundles):
        return None
    return [[rank_of[b] for b in bundles] for bundles in engine_bundles]


def feeder_ranks(num_ranks: int, num_engines: int, pipeline_stages: int = 1) -> Optional[list[int]]:
    """The train rank that opens engine e's update group and broadcasts to it: e % num_ranks (every rank holds the whole
    model after the TP gather, so the engines are spread over them and broadcast in parallel), or None where the model
    is split into pipeline stages (the driver sends)."""
    if pipeline_stages > 1 or num_ranks < 1:
        return None
    return [e % num_ranks for e in range(num_engines)]
