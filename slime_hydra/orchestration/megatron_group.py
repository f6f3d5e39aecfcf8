"""The megatron train group: one Ray actor per rank, the ranks one torch.distributed group with megatron's groups.

`cluster.actor_num_nodes × cluster.actor_num_gpus_per_node` ranks (one per actor bundle) join one process group
(gloo on CPU, NCCL on GPU) through the tcp rendezvous the torch ranks use (training/distributed.py), bounded by
`cluster.distributed_timeout_s`; each then builds megatron's TP/PP/DP groups from the `parallelism` group
(training/megatron/parallel.py uses the existing group). Unlike the torch group (train_group.py) the driver
does not split batches: every megatron rank takes the whole batch and picks its data-parallel share itself,
and every trainer method is a collective over the TP/PP/DP groups (a rank that skipped one would leave the
others waiting in it), so every call goes to every rank. The backend returns the step's metrics, the SFT
loss and log-probs on every rank (broadcast from the last pipeline stage), so rank 0 answers. Weights for local rollout
engines are every stage's TP-gathered Hugging Face tensors, gathered onto the first stage: rank 0's result goes into
the object store, and the rollout manager hands the reference to its engines. Checkpoints are the backend's: HF
weights written by one rank per stage, and megatron's distributed format written by every rank (save_checkpoint /
load_checkpoint: nothing of the trainer in the state files).

SGLang engines get the weights from the ranks instead (orchestration/rank_weights.py), each pipeline stage's layers
from a rank of that stage (the ranks report their stage at setup): colocated ones as handles (CUDA IPC on GPUs) from
ranks on their node, disaggregated ones over update groups the ranks open, one per engine and stage (NCCL on GPUs,
gloo on CPU). Every wait has the deadline `cluster.ray_call_timeout_s` (orchestration/calls.py). PPO's critic lives
in the ranks beside the policy (training/megatron/critic.py): `values` and the critic's steps inside `train_rollout`
are collectives like the rest, its gradients summed over DP by megatron's DDP.
"""

from __future__ import annotations

from typing import Any, Optional

import ray
import torch

from slime_hydra.config.schema import MegatronConfig, ModelConfig, ParallelismConfig
from slime_hydra.orchestration import stacks
from slime_hydra.orchestration.calls import RayCalls
from slime_hydra.orchestration.placement import Layout, node_ip_and_free_port, on_bundle
from slime_hydra.orchestration.rank_weights import RankStage, RankWeights, WeightsRef, senders_of, weights_of
from slime_hydra.orchestration.stacks import ActorProcess
from slime_hydra.protocols import Route, TrainBatch
from slime_hydra.training.distributed import collective_failures
from slime_hydra.training.specs import AlgorithmSpecs


class MegatronRank(RankStage):
    """One megatron rank (a Ray actor) on its bundle's device; RankStage: weights sent to a colocated engine."""

    def __init__(self, rank: int, world_size: int, use_gpu: bool, num_threads: Optional[int]):
        torch.set_num_threads(num_threads or 1)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.trainer = None

    def address(self) -> tuple[str, int]:
        return node_ip_and_free_port()

    def register_stacks(self, directory: str) -> ActorProcess:
        return stacks.register(f"train rank {self.rank}", directory)

    def setup(self, init_method: str, distributed_timeout_s: float, model: ModelConfig, parallel: ParallelismConfig,
              specs: AlgorithmSpecs, megatron: MegatronConfig, temperature: float, seed: int) -> None:
        from slime_hydra.models.build import build_model, build_tokenizer
        from slime_hydra.runtime import seed_everything
        from slime_hydra.training.distributed import init_process_group
        from slime_hydra.training.megatron.trainer import build_trainer  # megatron-core: imported in the rank only

        init_process_group(self.rank, self.world_size, init_method, self.device, distributed_timeout_s)
        seed_everything(seed)
        net = build_model(model, build_tokenizer(model), seed)  # the HF weights the single-process build converts
        self.trainer = build_trainer(net.state_dict(), net.config, model, parallel, megatron, specs, temperature, self.device,
                                     seed=seed, distributed_timeout_s=distributed_timeout_s)

    def pipeline_stage(self) -> int:
        from megatron.core import parallel_state as ps  # megatron-core: imported in the rank only

        return ps.get_pipeline_model_parallel_rank()

    def call(self, name: str, *args: Any) -> Any:
        """A collective of the call that times out (gloo; NCCL ends the process, see training/distributed.py) reaches
        the driver as a RunError naming the call, this rank and cluster.distributed_timeout_s, not gloo's traceback."""
        with collective_failures(f"megatron {name}", self.rank):
            return getattr(self.trainer, name)(*args)

    def named_weights(self) -> tuple[list[tuple[str, torch.Tensor]], bool]:
        """Collective; (weights, done): rank 0's weights are the whole model, the others' [] (nothing twice in the object
        store). Called with num_returns=2, so the driver waits on every rank's `done` without fetching the weights."""
        weights = self.trainer.named_weights_all_stages()
        return (weights if self.rank == 0 else []), True

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class MegatronTrainGroup:
    """The driver's view of the megatron ranks; implements TrainBackend (slime_hydra/protocols.py)."""

    def __init__(self, pg, layout: Layout, num_threads: Optional[int], calls: RayCalls, distributed_timeout_s: float,
                 weight_route: Optional[Route] = None):
        """weight_route: as TrainGroup's (the ranks serve it themselves with PP=1)."""
        world = len(layout.actor_bundles)
        self.calls, self.distributed_timeout_s, self.weight_route = calls, distributed_timeout_s, weight_route
        self.labels = [f"rank {r}" for r in range(world)]
        self.layout, self.pg = layout, pg
        self.engine_ranks: Optional[list] = None  # set by setup: the pipeline split decides too (rank_weights.engine_ranks)
        self.feeders: Optional[list] = None  # likewise: who broadcasts each stage to each engine's update group
        actor = ray.remote(MegatronRank)
        self.ranks = [actor.options(**layout.actor_options(), **on_bundle(pg, b)).remote(r, world, layout.use_gpu, num_threads)
                      for r, b in enumerate(layout.actor_bundles)]

    def setup(self, model: ModelConfig, parallel: ParallelismConfig, specs: AlgorithmSpecs, megatron: MegatronConfig,
              temperature: float, seed: int) -> None:
        ip, port = self.calls.get(self.ranks[0].address.remote(), "starting the train actor", ["rank 0"])
        self.calls.get([r.setup.remote(f"tcp://{ip}:{port}", self.distributed_timeout_s, model, parallel, specs, megatron,
                                       temperature, seed) for r in self.ranks],
                       "train setup (process group, megatron groups, model)", self.labels)
        self.stages = self.calls.get([r.pipeline_stage.remote() for r in self.ranks], "the ranks' pipeline stages", self.labels)
        self.engine_ranks, self.feeders = senders_of(self.pg, self.layout, self.stages)  # engine_ranks None: object store

    def _all(self, what: str, name: str, *args: Any) -> Any:
        """`name` on every rank (a collective); rank 0's answer."""
        return self.calls.get([r.call.remote(name, *args) for r in self.ranks], what, self.labels)[0]

    # -- TrainBackend ------------------------------------------------------------------------
    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        return self._all("train step", "train_rollout", ray.put(batch))  # one copy in the object store for all ranks

    def compute_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        return self._all("log-probs", "compute_log_probs", ray.put(batch))

    def reward_kl(self, batch: TrainBatch) -> torch.Tensor:
        return self._all("reward_kl", "reward_kl", ray.put(batch))

    def sft_step(self, batch: TrainBatch, lr: float) -> float:
        return self._all("warm start (sft_step)", "sft_step", ray.put(batch), lr)

    def freeze_reference(self) -> None:
        self._all("freeze_reference", "freeze_reference")

    def end_warm_start(self) -> None:
        self._all("end of the warm start", "end_warm_start")

    def named_weights(self) -> WeightsRef | RankWeights:
        """Each stage's TP-gathered weights, staged on its ranks' devices and sent from there, stage by stage, when the
        rollout's route is one the ranks serve (orchestration/rank_weights.py). Otherwise, or when iterated: rank 0's
        weights of every stage, gathered onto it and left in the object store (the rollout manager passes the reference on)."""
        return weights_of(self.ranks, self.weight_route, self.engine_ranks, self.feeders, self.calls, self._in_object_store)

    def _in_object_store(self) -> WeightsRef:
        refs = [r.named_weights.options(num_returns=2).remote() for r in self.ranks]
        self.calls.get([done for _, done in refs], "gathering the weights", self.labels)  # a failed rank is named here
        return WeightsRef(refs[0][0], self.calls)

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """ppo: the critic's values (a collective: the critic is a megatron model of the ranks' layout)."""
        return self._all("values", "values", ray.put(batch))

    def save_hf(self, path: str, tokenizer) -> None:
        self._all("checkpoint (save_hf)", "save_hf", path, tokenizer)

    def state_dict(self) -> None:
        """None: the ranks' state is megatron's distributed checkpoint (save_checkpoint), not the engine's state files."""
        return None

    def load_state_dict(self, state: Any) -> None:
        pass  # load_checkpoint restores it

    # -- megatron's own checkpoint format -----------------------------------------------------
    def save_checkpoint(self, path: str) -> None:
        self._all("checkpoint (megatron save)", "save_checkpoint", path)

    def load_checkpoint(self, path: str) -> None:
        self._all("resume (megatron load)", "load_checkpoint", path)

    def release_memory(self) -> dict[str, float]:
        """Every rank's (each holds its own shards); rank 0's figures."""
        return self.calls.get([r.release_memory.remote() for r in self.ranks], "releasing the trainer's memory", self.labels)[0]

    def resume_memory(self) -> None:
        self.calls.get([r.resume_memory.remote() for r in self.ranks], "restoring the trainer's memory", self.labels)

    def register_stacks(self, directory: str) -> list[ActorProcess]:
        """Each rank dumps its stacks to `directory` on SIGUSR2 (orchestration/stacks.py: the stall watchdog)."""
        return self.calls.get([r.register_stacks.remote(directory) for r in self.ranks], "registering stack dumps", self.labels)

    def shutdown(self) -> None:
        """Bounded: a rank still stuck in the call that failed does not answer; it is killed all the same."""
        self.calls.shutdown([r.shutdown.remote() for r in self.ranks], "train shutdown", self.labels)
        for r in self.ranks:
            ray.kill(r)
