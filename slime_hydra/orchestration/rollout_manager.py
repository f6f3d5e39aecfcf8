"""The rollout manager: a Ray actor owning the rollout engines and the data source, as in slime.

Engines are Ray actors on the rollout slice of the placement group (one per
`cluster.rollout_num_gpus_per_engine` bundles); the manager splits each batch of samples over them
and gathers the results. The driver talks to the manager through two thin proxies that implement
the Protocols the loop already uses (RolloutBackend, and the prompt source), so the loop is the same
in one process and on a cluster. Weights go from train rank 0 to every engine through the object
store; the driver only passes the reference along.

Every wait has the deadline `cluster.ray_call_timeout_s` (orchestration/calls.py): the manager's waits on its
engines name the engine; the driver's waits on the manager are a little longer (`nested`), so an engine that
hangs is reported as that engine, not as the manager.

Left out: engines other than `rollout.backend=local` (an SGLang engine would be another engine class
on the same bundles), and rewards inside the manager (the driver scores, as in one process).
"""

from __future__ import annotations

from typing import Callable, Optional

import ray

from slime_hydra.aio import run_sync
from slime_hydra.config.schema import ModelConfig, RolloutConfig
from slime_hydra.orchestration import stacks
from slime_hydra.orchestration.calls import RayCalls, get
from slime_hydra.orchestration.placement import Layout, on_bundle
from slime_hydra.orchestration.rank_weights import OBJECT_STORE
from slime_hydra.orchestration.stacks import ActorProcess
from slime_hydra.protocols import Weights
from slime_hydra.types import Sample, SamplingParams


class RolloutEngine:
    """One `rollout.backend=local` engine (a Ray actor) on its bundle's device."""

    def __init__(self, model: ModelConfig, seed: int, generation_batch_size: int, use_gpu: bool, num_threads: Optional[int]):
        import torch

        from slime_hydra.models.build import build_model, build_tokenizer
        from slime_hydra.rollout.local import LocalRollout

        torch.set_num_threads(num_threads or 1)
        tok = build_tokenizer(model)
        net = build_model(model, tok, seed).to("cuda" if use_gpu else "cpu")
        self.engine = LocalRollout(net, tok, seed=seed, generation_batch_size=generation_batch_size,
                                   model_impl=model.model_impl)

    def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Sample]:
        return run_sync(self.engine.generate(samples, sampling))

    def update_weights(self, named_tensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def state_dict(self) -> dict:
        return self.engine.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.engine.load_state_dict(state)

    def register_stacks(self, label: str, directory: str) -> ActorProcess:
        return stacks.register(label, directory)


class RolloutManager:
    """Owns the engines and the prompt source (a Ray actor that itself takes no CPU)."""

    def __init__(self, pg, layout: Layout, model: ModelConfig, prompts: list, rollout: RolloutConfig, seed: int,
                 num_threads: Optional[int], call_timeout_s: float):
        from slime_hydra.data.source import PromptSource

        # the prompts the driver loaded (and checked) once; the manager owns their order from here on
        self.source = PromptSource(prompts, rollout.n_samples_per_prompt, rollout.rollout_shuffle, rollout.rollout_seed)
        engine = ray.remote(RolloutEngine)
        # engine e samples with seed + e: one engine draws exactly what the in-process rollout draws
        self.engines = [engine.options(**layout.actor_options(), **on_bundle(pg, bundles[0])).remote(
                            model, seed + e, rollout.generation_batch_size, layout.use_gpu, num_threads)
                        for e, bundles in enumerate(layout.engine_bundles)]
        self.labels = [f"rollout engine {e}" for e in range(len(self.engines))]
        self.timeout_s = call_timeout_s
        self.weight_version = 0

    def num_engines(self) -> int:
        return len(self.engines)

    def register_stacks(self, directory: str) -> list[ActorProcess]:
        """This actor's and every engine's stack dump on SIGUSR2 (orchestration/stacks.py: the stall watchdog)."""
        engines = get([e.register_stacks.remote(label, directory) for e, label in zip(self.engines, self.labels)],
                      "registering stack dumps", self.timeout_s, self.labels)
        return [stacks.register("rollout manager", directory), *engines]

    def next_groups(self, num_groups: int) -> list[list[Sample]]:
        return self.source.next_groups(num_groups)

    def source_state(self) -> dict:
        return self.source.state_dict()

    def load_source_state(self, state: dict) -> None:
        self.source.load_state_dict(state)

    def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Sample]:
        n = len(self.engines)
        bounds = [len(samples) * e // n for e in range(n + 1)]  # contiguous, near-equal chunks
        parts = get([eng.generate.remote(samples[bounds[e] : bounds[e + 1]], sampling) for e, eng in enumerate(self.engines)],
                    "rollout generate", self.timeout_s, self.labels)
        return [s for part in parts for s in part]

    def update_weights(self, weights_ref: list, version: int) -> None:
        """`weights_ref` is [ObjectRef] (wrapped, so Ray hands it over unresolved): each engine fetches it."""
        get([eng.update_weights.remote(weights_ref[0], version) for eng in self.engines], "weight sync", self.timeout_s,
            self.labels)
        self.weight_version = version

    def state_dict(self) -> dict:
        engines = get([e.state_dict.remote() for e in self.engines], "checkpoint (engine state)", self.timeout_s, self.labels)
        return {"engines": engines, "weight_version": self.weight_version}

    def load_state_dict(self, state: dict) -> None:
        get([e.load_state_dict.remote(s) for e, s in zip(self.engines, state["engines"])], "resume (engine state)",
            self.timeout_s, self.labels)
        self.weight_version = state["weight_version"]

    def shutdown(self) -> None:
        for e in self.engines:
            ray.kill(e)


def start_rollout_manager(pg, layout: Layout, model: ModelConfig, prompts: list, rollout: RolloutConfig, seed: int,
                          num_threads: Optional[int], calls: RayCalls,
                          on_shutdown: Optional[Callable[[], None]] = None) -> tuple[RemoteRollout, RemoteSource]:
    """The manager actor with its engines on the layout's rollout bundles, and the driver's two proxies to it. The
    manager itself takes no CPU: its engines hold the bundles."""
    manager = ray.remote(RolloutManager).options(num_cpus=0).remote(
        pg, layout, model, prompts, rollout, seed, num_threads, calls.timeout_s)
    return RemoteRollout(manager, calls, on_shutdown=on_shutdown), RemoteSource(manager, calls)


class RemoteRollout:
    """The driver's RolloutBackend: every call goes to the manager."""

    cooperative = False  # generate() awaits one actor call

    def __init__(self, manager, calls: RayCalls, on_shutdown=None):
        self.manager, self.calls = manager, calls
        self.weight_version = 0
        self._on_shutdown = on_shutdown

    async def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Sample]:
        done = await self.calls.get_async(self.manager.generate.remote(samples, sampling), "rollout generate",
                                          "the rollout manager", nested=True)
        for mine, theirs in zip(samples, done):  # fill the caller's objects in place, as an in-process engine does
            mine.__dict__.update(theirs.__dict__)
        return samples

    def abort(self) -> None:
        """Engines are synchronous actors: a generate call runs to the end, so every sample comes back done."""

    def update_weights(self, weights: Weights, version: int) -> None:
        """Weights already in the object store (the train ranks') go on as their reference; others are put there."""
        held = weights.sender(OBJECT_STORE)
        ref = held.ref if held is not None else ray.put(list(weights))
        self.calls.get(self.manager.update_weights.remote([ref], version), "weight sync", ["the rollout manager"], nested=True)
        self.weight_version = version

    def metrics(self) -> dict[str, float]:
        return {}  # the engines are rollout.backend=local, which has no figures of its own

    def state_dict(self) -> dict:
        return self.calls.get(self.manager.state_dict.remote(), "checkpoint (rollout state)", ["the rollout manager"],
                              nested=True)

    def load_state_dict(self, state: dict) -> None:
        self.calls.get(self.manager.load_state_dict.remote(state), "resume (rollout state)", ["the rollout manager"], nested=True)
        self.weight_version = state["weight_version"]

    def register_stacks(self, directory: str) -> list[ActorProcess]:
        """The manager's and its engines' stack dumps on SIGUSR2 (the stall watchdog)."""
        return self.calls.get(self.manager.register_stacks.remote(directory), "registering stack dumps", ["the rollout manager"])

    def shutdown(self) -> None:
        """Bounded: a manager still stuck in the call that failed does not answer; it is killed all the same (and its
        engines with it, their owner)."""
        self.calls.shutdown(self.manager.shutdown.remote(), "rollout shutdown", ["the rollout manager"])
        ray.kill(self.manager)
        if self._on_shutdown is not None:
            self._on_shutdown()


class RemoteSource:
    """The driver's prompt source: the manager's PromptSource."""

    def __init__(self, manager, calls: RayCalls):
        self.manager, self.calls = manager, calls

    def next_groups(self, num_groups: int) -> list[list[Sample]]:
        return self.calls.get(self.manager.next_groups.remote(num_groups), "next prompts", ["the rollout manager"])

    def metrics(self) -> dict[str, float]:
        return {}  # in-memory prompts (data.streaming is refused with cluster.backend=ray)

    def state_dict(self) -> dict:
        return self.calls.get(self.manager.source_state.remote(), "checkpoint (data position)", ["the rollout manager"])

    def load_state_dict(self, state: dict) -> None:
        self.calls.get(self.manager.load_source_state.remote(state), "resume (data position)", ["the rollout manager"])
