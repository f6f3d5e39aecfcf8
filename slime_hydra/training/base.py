"""The training Protocol and the batch it consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Protocol, runtime_checkable

import torch

from slime_hydra.algorithms.losses import kl_estimate
from slime_hydra.training.specs import LossSpec


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


def shaping_kl(batch: TrainBatch, loss: LossSpec, log_probs: Callable[..., torch.Tensor], ref: Optional[object]) -> torch.Tensor:
    """[N, T] KL(pi_old || ref) on the loss mask for algorithm.kl_coef's reward shaping (slime: old = the
    recomputed log-probs, or the rollout's with use_rollout_logprobs; estimator kl_loss_type).
    `log_probs(batch, model=None)` is the backend's log-prob pass; `ref` its frozen reference."""
    if ref is None:
        raise RuntimeError("reward_kl needs the reference model: call freeze_reference() first (algorithm.kl_coef != 0)")
    old = batch.rollout_log_probs if loss.use_rollout_logprobs else log_probs(batch)
    return kl_estimate(old, log_probs(batch, ref), loss.kl_loss_type) * batch.loss_mask  # [N, T]


class TrainBackend(Protocol):
    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        """All optimizer steps for one rollout (the critic's too, for ppo); returns train/* metrics."""
        ...

    def reward_kl(self, batch: TrainBatch) -> torch.Tensor:
        """[N, T] KL(pi_old || ref) on the loss mask, for algorithm.kl_coef's reward shaping."""
        ...

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """[N, T] the critic's values on the loss mask (algorithm.advantage_estimator=ppo only)."""
        ...

    def sft_step(self, batch: TrainBatch, lr: float) -> float: ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    def save_hf(self, path: str, tokenizer) -> None: ...

    def state_dict(self) -> dict:
        """The trainer's resume state for the engine's state.pt (a DistCheckpointing backend has none)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class DistCheckpointing(Protocol):
    """A trainer whose resume state (weights, optimizer, reference, counters) is its own on-disk format written
    into the checkpoint directory (megatron's distributed checkpointing: any parallel layout, optimizer shards)
    instead of the engine's state.pt. Both calls are collective over the trainer's ranks."""

    def save_checkpoint(self, path: str) -> None: ...

    def load_checkpoint(self, path: str) -> None: ...
