"""Weights sent to the SGLang engines by the train ranks themselves, under Ray (slime's routes).

The driver route (WeightsRef below) copies rank 0's weights to the CPU, through the object store to the driver,
which sends them. slime keeps them where they are: every rank holds its pipeline stage's full (TP-gathered) Hugging
Face tensors on its own device after the gather, and each stage sends its own layers from there (which rank sends
which stage to which engine: orchestration/senders.py, on the nodes Ray placed the bundles on):
- colocated engines (`weight_sync=tensor`): each engine TP rank gets handles (CUDA IPC on a GPU, shared-memory files on
  CPU) from the train rank on its own bundle for that rank's stage, and from a rank of every other stage on the same
  node; the driver posts the payloads (HTTP), stage by stage, bucket by bucket, in one weight-update session.
- any engine over update groups (`weight_sync=distributed`, disaggregated): for each stage, one rank of the stage (on
  the engine's node where it has one; the engines spread over the stage's ranks) opens its own group with the engine
  as its rank 0 (NCCL from the rank's GPU, gloo on CPU; a new group when the engine is relaunched), posts each bucket's
  /update_weights_from_distributed from a thread and broadcasts (rollout/sglang/distributed.UpdateGroups); the engine
  meets it at the loopback on its own node, else at the rank's node IP. The stages feed an engine in turn; engines fed
  by different ranks receive at the same time.
The driver still pauses, flushes and continues each engine, and fetches no tensor.

`RankStage` is the rank's half (a mixin of the rank actors): `stage_weights` is a collective of every rank (the TP
gather) and keeps the tensors until the next stage on the ranks that send them; `weight_payload` serialises one bucket
and keeps it alive until `drop_payload`; `broadcast_weights` feeds an engine's update group. The driver's half is
what a train group's named_weights returns (`weights_of`), Weights (slime_hydra/protocols.py) either way: `RankWeights`
where the ranks send by the rollout's route themselves (its Sender: the rollout stages it and asks it to send), else a
`WeightsRef` to rank 0's weights in the object store (iterated by the driver, or its reference handed to the rollout
manager's engines: the OBJECT_STORE route).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence, TypeVar, cast
from urllib.parse import urlsplit

import torch

from slime_hydra.orchestration.placement import Layout, bundle_nodes
from slime_hydra.orchestration.senders import engine_ranks, feeder_ranks
from slime_hydra.protocols import Route
from slime_hydra.rollout.sglang import distributed as D
from slime_hydra.rollout.sglang import weights as W
from slime_hydra.rollout.sglang.endpoint import Endpoint
from slime_hydra.rollout.sglang.sources import DISTRIBUTED, TENSOR, Sender

if TYPE_CHECKING:  # not at run time: `slime-hydra plan` reads engine_ranks without importing ray
    from slime_hydra.orchestration.calls import RayCalls

S = TypeVar("S")


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

    def broadcast_weights(self, engine: int, url: Endpoint, launch: int, version: int, tp_size: int, buffer_bytes: int,
                          dtype: str, timeout: float) -> int:
        """The staged tensors to engine `engine` over its update group, this rank its rank 0 -> the number of requests."""
        if self._update_groups is None:
            self._update_groups = D.UpdateGroups(self.device.type)
        assert self._staged, "broadcast_weights before stage_weights(keep=True)"
        return self._update_groups.send(engine, url, launch, list(self._staged), version, tp_size, buffer_bytes, dtype, timeout,
                                        master_address(url))

    def check_weights(self, url: Endpoint, dtype: str, timeout: float) -> int:
        return W.check_equal(url, self._staged, dtype, timeout)

    def release_memory(self) -> dict[str, float]:
        """cluster.offload_train: the trainer's tensors to the host (TrainBackend.release_memory), and the staged weights
        with them, as host copies (a restarted engine is resynced from these while the trainer is released; the next
        sync stages afresh)."""
        self._staged = tuple((name, t.detach().to("cpu", copy=True)) for name, t in self._staged)
        self._buckets, self._kept = None, {}
        return self.trainer.release_memory()

    def resume_memory(self) -> None:
        self.trainer.resume_memory()

    def staged_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The staged tensors, on the CPU (not a collective): what a snapshot's reader iterates."""
        return [(name, t.detach().cpu()) for name, t in self._staged]


def master_address(url: Endpoint) -> str:
    """Where the engine at `url` reaches this process's update group: the loopback when it runs on this host, else this
    node's IP (an engine on another node of a multi-node placement)."""
    import ray  # here: `slime-hydra plan` imports this module without ray

    host, ip = urlsplit(url.url).hostname, ray.util.get_node_ip_address()
    return "127.0.0.1" if host in ("127.0.0.1", "localhost", "::1", ip) else ip


class WeightsRef:
    """Weights (slime_hydra/protocols.py): rank 0's (or its snapshot's) in the object store, put there when the ranks were
    asked, before any later train step (an actor runs its calls in order), so they are a snapshot already. Iterating
    fetches them; a rollout manager of local engines takes the reference as is (OBJECT_STORE)."""

    def __init__(self, ref, calls: RayCalls):
        """ref: one object ref, or a list of them (a snapshot's pipeline stages in order, each a rank's staged copy)."""
        self.ref, self.calls = ref, calls

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        if isinstance(self.ref, list):
            parts = self.calls.get(self.ref, "fetching the weights", [f"stage {s}" for s in range(len(self.ref))])
            return iter([kv for part in parts for kv in part])
        return iter(self.calls.get(self.ref, "fetching the weights", ["rank 0"]))

    def snapshot(self) -> WeightsRef:
        return self

    def sender(self, route: Route[S]) -> Optional[S]:
        return cast(S, self) if route == OBJECT_STORE else None


OBJECT_STORE: Route[WeightsRef] = Route("object store")  # the rollout manager hands the reference on to its engines


class RankWeights:
    """Weights (slime_hydra/protocols.py) the ranks send themselves by `route` (rollout/sglang/sources: TENSOR or
    DISTRIBUTED): they are its sources.Sender. Per pipeline stage s (one entry with PP=1), each rank sends its own stage's
    layers: engine_ranks[s][e], the ranks of stage s whose handles engine e's TP ranks get, in the engine's TP order (the
    tensor route); feeders[s][e], the rank of stage s that broadcasts to engine e over its own update group (the
    distributed route); the other is None. in_object_store(): rank 0's weights in the object store (a WeightsRef), for
    whoever iterates."""

    def __init__(self, ranks: list, route: Route[Sender], engine_ranks: Optional[list[list[list[int]]]],
                 feeders: Optional[list[list[int]]], calls: RayCalls, in_object_store: Callable[[], WeightsRef]):
        self.ranks, self.route, self.engine_ranks, self.feeders, self.calls = ranks, route, engine_ranks, feeders, calls
        self._in_object_store = in_object_store
        self._staged = False  # staged for this sync: stage() does nothing more

    def sender(self, route: Route[S]) -> Optional[S]:
        if route == self.route:
            return cast(S, self)  # the route's sender type is sources.Sender, which this class implements
        return cast(S, self._in_object_store()) if route == OBJECT_STORE else None

    def _holders(self) -> set[int]:
        return ({r for stage in self.engine_ranks or () for rs in stage for r in rs}
                | {r for stage in self.feeders or () for r in stage})

    def stage(self) -> None:
        """Every rank (a collective: megatron's TP gather) stages its tensors on its device; those that send keep them."""
        self._stage(self._holders(), copy=False)

    def snapshot(self) -> RankWeights:
        """These weights, staged now into copies on the ranks that send them (training goes on before they are sent:
        train_mode=async); rank 0 keeps one too (and a rank of each later pipeline stage), which iterating then reads
        instead of the ranks' live weights."""
        leads = [0] + self.senders(0)[1:]
        self._stage(self._holders() | set(leads), copy=True)
        if len(leads) == 1:
            self._in_object_store = lambda: WeightsRef(self.ranks[0].staged_weights.remote(), self.calls)
        else:
            self._in_object_store = lambda: WeightsRef([self.ranks[r].staged_weights.remote() for r in leads], self.calls)
        return self

    def _stage(self, holders: set[int], copy: bool) -> None:
        if self._staged:
            return
        self.calls.get([r.stage_weights.remote(i in holders, copy) for i, r in enumerate(self.ranks)], "staging the weights",
                       [f"rank {r}" for r in range(len(self.ranks))])
        self._staged = True

    def _payloads(self, engine: int, buffer_bytes: int, dtype: str) -> Iterator[tuple[list[str], Optional[str]]]:
        """Stage by stage, bucket by bucket: each of the engine's TP ranks gets handles from its sender of that stage."""
        for stage in self.engine_ranks:
            labels = [f"rank {r}" for r in stage[engine]]
            ranks = [self.ranks[r] for r in stage[engine]]
            index, count = 0, 1
            while index < count:
                got = self.calls.get([r.weight_payload.remote(index, buffer_bytes, dtype) for r in ranks],
                                     f"weight handles for sglang engine {engine}", labels)
                count = got[0][2]
                yield [payload for payload, _, _ in got], got[0][1]  # the engine has read the bucket when this resumes
                self.calls.get([r.drop_payload.remote(index) for r in ranks], "releasing a weight bucket", labels)
                index += 1

    def send(self, engine: int, url: Endpoint, version: int, tp_size: int, buffer_bytes: int, dtype: str, timeout: float) -> int:
        assert all(len(stage[engine]) == tp_size for stage in self.engine_ranks), (self.engine_ranks, tp_size)
        return W.update_from_payloads(url, self._payloads(engine, buffer_bytes, dtype), version, timeout)

    def broadcast(self, engine: int, url: Endpoint, launch: int, version: int, tp_size: int, buffer_bytes: int, dtype: str,
                  timeout: float) -> int:
        """Each stage's feeder in turn, over its own update group with the engine (one weight-update session at a time)."""
        n = 0
        for s, stage in enumerate(self.feeders):
            r = stage[engine]
            n += self.calls.get(self.ranks[r].broadcast_weights.remote(engine, url, launch, version, tp_size, buffer_bytes,
                                                                       dtype, timeout),
                                f"broadcasting stage {s}'s weights to sglang engine {engine} over its update group", [f"rank {r}"])
        return n

    def senders(self, engine: int) -> list[int]:
        """The rank that holds each stage's tensors for engine `engine` (its first TP rank's, on the tensor route)."""
        if self.engine_ranks is not None:
            return [stage[engine][0] for stage in self.engine_ranks]
        return [stage[engine] for stage in self.feeders]

    def check_equal(self, engine: int, url: Endpoint, dtype: str, timeout: float) -> int:
        """Each stage's sender checks the engine against its own stage's tensors -> the tensors compared, all stages."""
        ranks = self.senders(engine)
        return sum(self.calls.get([self.ranks[r].check_weights.remote(url, dtype, timeout) for r in ranks],
                                  "check_weight_update_equal", [f"rank {r}" for r in ranks]))

    def to_host(self) -> "RankWeights":
        """Itself: the ranks move their staged tensors to the host when they release (RankStage.release_memory)."""
        return self

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._in_object_store())


def weights_of(ranks: list, route: Optional[Route[Sender]], engine_ranks: Optional[list[list[list[int]]]],
               feeders: Optional[list[list[int]]], calls: RayCalls, in_object_store: Callable[[], WeightsRef]) -> RankWeights | WeightsRef:
    """A train group's weights for the rollout's `route`: RankWeights where the ranks send by it themselves (engine_ranks
    for TENSOR, feeders for DISTRIBUTED), else rank 0's in the object store."""
    if route == TENSOR and engine_ranks is not None:
        return RankWeights(ranks, route, engine_ranks, None, calls, in_object_store)
    if route == DISTRIBUTED and feeders is not None:
        return RankWeights(ranks, route, None, feeders, calls, in_object_store)
    return in_object_store()


def senders_of(pg, layout: Layout, stages: Optional[Sequence[int]] = None) -> tuple[Optional[list], Optional[list]]:
    """(engine_ranks, feeder_ranks) for the ranks' pipeline `stages`, on the nodes Ray placed the group's bundles on. An
    engine on bundles of another placement group (engines a run shares between train groups) has no node here (None):
    any rank of a stage may feed it over an update group, and no rank sends it handles."""
    placed = bundle_nodes(pg)
    nodes = {b: placed.get(b) for b in (*layout.actor_bundles, *(b for bs in layout.engine_bundles for b in bs))}
    return (engine_ranks(layout.actor_bundles, layout.engine_bundles, stages, nodes),
            feeder_ranks(len(layout.actor_bundles), len(layout.engine_bundles), stages,
                         [nodes[b] for b in layout.actor_bundles], [nodes[bs[0]] for bs in layout.engine_bundles]))
