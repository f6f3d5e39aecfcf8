"""The interfaces the engine calls, all of them: rollout backend, train backend, tracker, reward scorer, and the
Weights a trainer hands the rollout.

Bottom floor (imports only types and torch): the engine, the builders and every backend point down to
here. Each Protocol lists every method the loop, the warm start and the checkpointing call; a capability
some backends lack is a declared attribute (`RolloutBackend.cooperative`) or a no-op method
(`TrainBackend.save_checkpoint` on a trainer whose state travels in `state_dict`), never a probe.
tests/static/typecheck/conformance.py assigns every backend class to its Protocol and mypy checks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Iterator, Optional, Protocol, TypeVar

import torch

from slime_hydra.types import Sample, SamplingParams


class RolloutBackend(Protocol):
    @property
    def weight_version(self) -> int:
        """The version passed to the last update_weights (or restored by load_state_dict)."""
        ...

    @property
    def cooperative(self) -> bool:
        """generate() yields to the event loop after every decode step, so an abort takes effect exactly there."""
        ...

    async def generate(self, samples: list[Sample], sampling: SamplingParams) -> list[Sample]:
        """Fill tokens, response, response_length, rollout_log_probs, status, weight_version."""
        ...

    def abort(self) -> None:
        """Stop the generate() in progress soon: unfinished samples return with the response so far and
        status ABORTED (a later generate() continues them from their tokens). Safe to call when idle; a
        backend whose generate always runs to the end does nothing."""
        ...

    def update_weights(self, weights: Weights, version: int) -> None:
        """The engines take `weights` (iterated here, or sent by their holders: Weights.sender) and stamp `version`."""
        ...

    def metrics(self) -> dict[str, float]:
        """The backend's own figures (`section/name` -> value: sync timings, request and retry counts),
        logged with every rollout step; what belongs to one weight sync is reported once; {} if none."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def shutdown(self) -> None: ...


S = TypeVar("S")


@dataclass(frozen=True)
class Route(Generic[S]):
    """A way for weights to reach a rollout's engines that the weights' holders may take themselves (Ray's train ranks
    post handles to their own tensors, or broadcast them). The rollout that takes it declares it, with `S`, the type of
    what sends by it (rollout/sglang/sources.TENSOR and DISTRIBUTED, orchestration/rank_weights.OBJECT_STORE)."""

    name: str


class Weights(Protocol):
    """What a trainer hands the rollout (TrainBackend.named_weights), in one process or under Ray."""

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor) of every weight, here: the trainer's tensors, or fetched from where they live."""
        ...

    def snapshot(self) -> Weights:
        """These weights as they are now, for an update_weights later while training goes on (train_mode=async): a copy,
        kept where the weights live (the Ray ranks copy theirs on their devices)."""
        ...

    def sender(self, route: Route[S]) -> Optional[S]:
        """What sends these weights by `route` from where they live, or None where they do not send themselves that way
        (the rollout then iterates them and sends from its own process)."""
        ...


class InProcessWeights:
    """Weights of this process. `named()` yields them as they are when iterated (the live parameters); snapshot() holds
    copies. They send themselves by no route: the rollout iterates them."""

    def __init__(self, named: Callable[[], Iterable[tuple[str, torch.Tensor]]]):
        self.named = named

    @classmethod
    def of(cls, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> InProcessWeights:
        """Weights of these (name, tensor) pairs, listed now."""
        held = list(named_tensors)
        return cls(lambda: held)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.named())

    def snapshot(self) -> InProcessWeights:
        return InProcessWeights.of((name, t.detach().clone()) for name, t in self)

    def sender(self, route: Route[S]) -> None:
        return None


@dataclass
class TrainBatch:
    """Right-padded sequences; position t of every [N, T] tensor is the prediction of token t+1."""

    input_ids: torch.Tensor  # [N, T+1]
    attention_mask: torch.Tensor  # [N, T+1]
    loss_mask: torch.Tensor  # [N, T] 1 on response tokens that train
    advantages: torch.Tensor  # [N, T]
    rollout_log_probs: Optional[torch.Tensor] = None  # [N, T]
    returns: Optional[torch.Tensor] = None  # [N, T] value targets (ppo: GAE advantages + old values)
    values: Optional[torch.Tensor] = None  # [N, T] the critic's values at rollout time (ppo's old values)

    @property
    def num_samples(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> "TrainBatch":
        """Rows `idx`, trimmed to the longest sequence among them."""
        t = int(self.attention_mask[idx].sum(-1).max().item()) if len(idx) else 1
        def rows(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if x is None else x[idx, : t - 1]

        return TrainBatch(self.input_ids[idx, :t], self.attention_mask[idx, :t], self.loss_mask[idx, : t - 1],
                          self.advantages[idx, : t - 1], rows(self.rollout_log_probs), rows(self.returns), rows(self.values))


class TrainBackend(Protocol):
    def freeze_reference(self) -> None:
        """Snapshot the current policy as the KL reference (before the first rollout; a no-op without KL)."""
        ...

    def sft_step(self, batch: TrainBatch, lr: float) -> float:
        """One supervised step of the warm start; its loss."""
        ...

    def end_warm_start(self) -> None:
        """The warm start is over: drop its optimizer (and re-read the weights into the RL optimizer's copies)."""
        ...

    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        """All optimizer steps for one rollout (the critic's too, for ppo); returns train/* metrics."""
        ...

    def reward_kl(self, batch: TrainBatch) -> torch.Tensor:
        """[N, T] KL(pi_old || ref) on the loss mask, for algorithm.kl_coef's reward shaping."""
        ...

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """[N, T] the critic's values on the loss mask (algorithm.advantage_estimator=ppo only)."""
        ...

    def named_weights(self) -> Weights:
        """The policy's weights under their Hugging Face names, for the rollout (iterated, snapshotted or sent)."""
        ...

    def save_hf(self, path: str, tokenizer) -> None: ...

    def state_dict(self) -> Optional[dict]:
        """The trainer's resume state for the checkpoint's state files (state.json); None when it is all in save_checkpoint's files."""
        ...

    def load_state_dict(self, state: Any) -> None:
        """`state`: what this trainer's state_dict returned."""
        ...

    def save_checkpoint(self, path: str) -> None:
        """The trainer's own on-disk resume state into the checkpoint directory `path` (megatron's distributed
        checkpoint, collective over its ranks); a no-op for a trainer whose state is all in state_dict."""
        ...

    def load_checkpoint(self, path: str) -> None:
        """The inverse of save_checkpoint (a no-op where that is one)."""
        ...

    def release_memory(self) -> dict[str, float]:
        """cluster.offload_train, while the engines generate: the trainer's weights, gradients, optimizer state,
        reference and critic wait in host memory (training/offload.py) until resume_memory; no other method is called
        in between. -> figures (`perf/offload_gib`: bytes moved, one rank's)."""
        ...

    def resume_memory(self) -> None:
        """Everything release_memory moved is back, bit for bit."""
        ...


class Tracker(Protocol):
    @property
    def run_id(self) -> Optional[str]:
        """The run's id in the tracking store (a resume logs into it again); None where there is none."""
        ...

    def log_params(self, params: dict[str, object]) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_artifact(self, path: str, artifact_path: Optional[str] = None) -> None: ...

    def close(self, status: str = "FINISHED") -> None: ...

    def missing_report(self) -> Optional[str]:
        """What the run could not log (a tracker outage: tracking/retrying.py), for the run's end; None when nothing."""
        ...


class Scorer(Protocol):
    def score(self, samples: list[Sample]) -> None:
        """Fill `sample.reward` in place."""
        ...

    async def score_async(self, samples: list[Sample]) -> None:
        """`score` from inside a running event loop (the rollout collector scores groups as they finish)."""
        ...

    def metrics(self) -> dict[str, float]:
        """Figures since the last call (`perf/reward_time_s`, remote RM counters)."""
        ...


class PromptSource(Protocol):
    """Where a rollout's prompt groups come from (data/source.py in memory, data/stream.py streamed, the Ray
    manager's through orchestration/rollout_manager.RemoteSource); its position is part of every checkpoint."""

    def next_groups(self, num_groups: int) -> list[list[Sample]]:
        """`num_groups` groups of n_samples_per_prompt samples each, in the data order (epochs continue)."""
        ...

    def metrics(self) -> dict[str, float]:
        """The source's figures for this rollout (`data/skipped_rows` of streamed data)."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
