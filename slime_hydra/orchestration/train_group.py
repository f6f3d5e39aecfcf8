"""The train group: one Ray actor per data-parallel rank, driven through the TrainBackend Protocol.

As in slime's RayTrainGroup, the driver holds handles, not models. `async_train` returns one future
per rank and `train_rollout` is `ray.get` of it, so a loop that wants training to overlap the next
rollout calls the first and gets the result later: where the `ray.get` sits decides the
synchronisation. Each optimizer step's samples are split evenly over the ranks; gradients are
all-reduced inside the ranks (slime_hydra/training/distributed.py), so every rank holds the same
weights and rank 0 answers for the group (weights, checkpoints, state); SGLang engines get the weights from the ranks
instead (orchestration/rank_weights.py: colocated ones from the rank(s) on their bundles, the others over update groups
the ranks open). The SFT warm start gives every
rank the whole batch: identical work, identical weights, no communication.

Ranks log their own timings into the driver's MLflow run by run id (`perf/rank<r>_train_time_s`).
Every wait on a rank has the deadline `cluster.ray_call_timeout_s` (orchestration/calls.py); the ranks'
collectives have `cluster.distributed_timeout_s` (training/distributed.py), shorter by default, so a rank
stuck in an all-reduce reports itself before the driver's wait on the whole step runs out.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import ray
import torch

from slime_hydra.config.schema import ModelConfig
from slime_hydra.orchestration import stacks
from slime_hydra.orchestration.calls import RayCalls
from slime_hydra.orchestration.placement import Layout, node_ip_and_free_port, on_bundle
from slime_hydra.orchestration.rank_weights import RankStage, RankWeights, WeightsRef, senders_of, weights_of
from slime_hydra.orchestration.stacks import ActorProcess
from slime_hydra.protocols import Route, TrainBatch
from slime_hydra.runtime import seed_everything
from slime_hydra.training.specs import AlgorithmSpecs


def split_for_ranks(batch: TrainBatch, num_steps: int, world_size: int) -> list[TrainBatch]:
    """Rank r gets the r-th 1/world of every optimizer step's samples, steps kept in order."""
    gbs = batch.num_samples // num_steps
    local = gbs // world_size
    out = []
    for r in range(world_size):
        idx = torch.cat([torch.arange(s * gbs + r * local, s * gbs + (r + 1) * local) for s in range(num_steps)])
        out.append(batch.select(idx))
    return out


# computed from the all-reduced gradient / the schedule
IDENTICAL_ON_RANKS = ("train/grad_norm", "train/lr", "train/value_grad_norm", "train/skipped_steps", "train/value_skipped_steps")


def merge_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Each rank's step metrics are its share of the step's (denominators are global): they add up. A rank's own GPU's
    figures (perf/: its memory) are per GPU: the largest."""
    keys = dict.fromkeys(k for m in per_rank for k in m)  # a rank whose samples were all skipped has no loss keys
    return {k: per_rank[0][k] if k in IDENTICAL_ON_RANKS else
            max(m.get(k, 0.0) for m in per_rank) if k.startswith("perf/") else sum(m.get(k, 0.0) for m in per_rank)
            for k in keys}


class TrainRank(RankStage):
    """One data-parallel rank (a Ray actor): a TorchTrainBackend with data-parallel collectives on its bundle's device;
    RankStage: weights sent to a colocated engine."""

    def __init__(self, rank: int, world_size: int, use_gpu: bool, num_threads: Optional[int],
                 tracking_uri: Optional[str], run_id: Optional[str]):
        torch.set_num_threads(num_threads or 1)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.tracking_uri, self.run_id = tracking_uri, run_id
        self.trainer = None

    def address(self) -> tuple[str, int]:
        return node_ip_and_free_port()

    def register_stacks(self, directory: str) -> ActorProcess:
        return stacks.register(f"train rank {self.rank}", directory)

    def setup(self, init_method: str, distributed_timeout_s: float, model: ModelConfig, specs: AlgorithmSpecs,
              temperature: float, seed: int) -> None:
        from slime_hydra.models.build import build_model, build_tokenizer
        from slime_hydra.training.distributed import DataParallel, init_process_group
        from slime_hydra.training.torch_backend import TorchTrainBackend

        init_process_group(self.rank, self.world_size, init_method, self.device, distributed_timeout_s)
        seed_everything(seed)
        net = build_model(model, build_tokenizer(model), seed)  # same seed: same initial weights on every rank
        self.trainer = TorchTrainBackend(net, specs.loss, specs.optim, specs.batch, temperature, self.device, critic=specs.critic,
                                         model_impl=model.model_impl, collectives=DataParallel(self.device))

    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        t0 = time.perf_counter()
        metrics = self.trainer.train_rollout(batch)
        if self.run_id:
            step = self.trainer.scheduler.last_epoch // self.trainer.batch.num_steps_per_rollout
            self._log({f"perf/rank{self.rank}_train_time_s": time.perf_counter() - t0}, step)
        return metrics

    def _log(self, metrics: dict[str, float], step: int) -> None:
        """The rank's own timing, logged into the run: a tracker that fails costs the point, never the step."""
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        ts = int(time.time() * 1000)
        try:
            MlflowClient(self.tracking_uri).log_batch(self.run_id, metrics=[Metric(k, v, ts, step) for k, v in metrics.items()])
        except Exception as e:  # noqa: BLE001 - the driver's tracker reports outages (tracking/retrying.py)
            print(f"train rank {self.rank}: tracker failed for step {step} ({type(e).__name__}); the point is lost", flush=True)

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, t.detach().cpu()) for n, t in self.trainer.named_weights()]

    def parameters(self) -> list[torch.Tensor]:
        return [p.detach().cpu().clone() for p in self.trainer.params]

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.trainer, name)(*args, **kwargs)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class TrainGroup:
    """The driver's view of the ranks; implements TrainBackend."""

    def __init__(self, pg, layout: Layout, num_threads: Optional[int], tracking_uri: Optional[str], run_id: Optional[str],
                 calls: RayCalls, distributed_timeout_s: float, weight_route: Optional[Route] = None):
        """weight_route: the route the rollout takes the weights by (rollout/sglang/sources.route_of), which the ranks
        serve themselves where they can; None: rank 0's weights through the object store."""
        world = len(layout.actor_bundles)
        self.calls, self.distributed_timeout_s, self.weight_route = calls, distributed_timeout_s, weight_route
        self.labels = [f"rank {r}" for r in range(world)]
        # who sends to each engine: the ranks on its bundles (None: not colocated), the rank that opens its update group
        self.engine_ranks, self.feeders = senders_of(pg, layout)
        actor = ray.remote(TrainRank)
        self.ranks = [actor.options(**layout.actor_options(), **on_bundle(pg, b)).remote(r, world, layout.use_gpu, num_threads,
                                                                                          tracking_uri, run_id)
                      for r, b in enumerate(layout.actor_bundles)]
        self.num_steps = 1

    def setup(self, model: ModelConfig, specs: AlgorithmSpecs, temperature: float, seed: int) -> None:
        ip, port = self.calls.get(self.ranks[0].address.remote(), "starting the train actor", ["rank 0"])
        self.num_steps = specs.batch.num_steps_per_rollout
        self.calls.get([r.setup.remote(f"tcp://{ip}:{port}", self.distributed_timeout_s, model, specs, temperature, seed)
                        for r in self.ranks],
                       "train setup (process group, model)", self.labels)

    # -- TrainBackend ------------------------------------------------------------------------
    def async_train(self, batch: TrainBatch) -> list:
        """One future per rank; `calls.get` them (merge_metrics of the results) where the loop should wait."""
        parts = split_for_ranks(batch, self.num_steps, len(self.ranks))
        return [r.train_rollout.remote(p) for r, p in zip(self.ranks, parts)]

    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        return merge_metrics(self.calls.get(self.async_train(batch), "train step", self.labels))

    def freeze_reference(self) -> None:
        self._all("freeze_reference")

    def end_warm_start(self) -> None:
        self._all("end_warm_start")

    def values(self, batch: TrainBatch) -> torch.Tensor:
        return self._all("values", batch)

    def reward_kl(self, batch: TrainBatch) -> torch.Tensor:
        return self.calls.get(self.ranks[0].call.remote("reward_kl", batch), "reward_kl", ["rank 0"])

    def sft_step(self, batch: TrainBatch, lr: float) -> float:
        return self._all("sft_step", batch, lr)

    def named_weights(self) -> WeightsRef | RankWeights:
        """Each rank's own (identical) weights, staged on its device and sent from there when the rollout's route is
        one the ranks serve (orchestration/rank_weights.py). Otherwise, or when iterated: rank 0's, in the object store."""
        return weights_of(self.ranks, self.weight_route, self.engine_ranks, self.feeders, self.calls, self._in_object_store)

    def _in_object_store(self) -> WeightsRef:
        return WeightsRef(self.ranks[0].named_weights.remote(), self.calls)

    def save_hf(self, path: str, tokenizer) -> None:
        self.calls.get(self.ranks[0].call.remote("save_hf", path, tokenizer), "checkpoint (save_hf)", ["rank 0"])

    def state_dict(self) -> dict:
        return self.calls.get(self.ranks[0].call.remote("state_dict"), "checkpoint (state_dict)", ["rank 0"])

    def load_state_dict(self, state: dict) -> None:
        self._all("load_state_dict", state)

    def save_checkpoint(self, path: str) -> None:
        """Nothing: the ranks are torch backends, whose resume state is rank 0's state_dict."""

    def load_checkpoint(self, path: str) -> None:
        """Nothing: see save_checkpoint."""

    def release_memory(self) -> dict[str, float]:
        return merge_metrics(self.calls.get([r.release_memory.remote() for r in self.ranks], "releasing the trainer's memory",
                                            self.labels))

    def resume_memory(self) -> None:
        self.calls.get([r.resume_memory.remote() for r in self.ranks], "restoring the trainer's memory", self.labels)

    def parameters(self, rank: int = 0) -> list[torch.Tensor]:
        return self.calls.get(self.ranks[rank].parameters.remote(), "parameters", [f"rank {rank}"])

    def _all(self, name: str, *args: Any) -> Any:
        return self.calls.get([r.call.remote(name, *args) for r in self.ranks], name, self.labels)[0]

    def register_stacks(self, directory: str) -> list[ActorProcess]:
        """Each rank dumps its stacks to `directory` on SIGUSR2 (orchestration/stacks.py: the stall watchdog)."""
        return self.calls.get([r.register_stacks.remote(directory) for r in self.ranks], "registering stack dumps", self.labels)

    def shutdown(self) -> None:
        """Bounded: a rank still stuck in the call that failed does not answer; it is killed all the same."""
        self.calls.shutdown([r.shutdown.remote() for r in self.ranks], "train shutdown", self.labels)
        for r in self.ranks:
            ray.kill(r)
