"""The train backend of debug_rollout_only (slime's --debug-rollout-only): no trainer is built.

No model copy, optimizer or reference: train_rollout trains nothing and logs no train/* metric, the KL and
values the advantages may ask for are zeros, and a checkpoint gets no weights, only the state files, whose trainer
state is MARKER so that a real run refuses to resume from it (the engine's build checks it).
"""

from __future__ import annotations

import torch

from slime_hydra.protocols import InProcessWeights, TrainBatch

MARKER = {"debug_rollout_only": True}


class NoTrain:
    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        return {}

    def reward_kl(self, batch: TrainBatch) -> torch.Tensor:
        return torch.zeros_like(batch.loss_mask, dtype=torch.float32)  # [N, T]

    def values(self, batch: TrainBatch) -> torch.Tensor:
        return torch.zeros_like(batch.loss_mask, dtype=torch.float32)  # [N, T]

    def sft_step(self, batch: TrainBatch, lr: float) -> float:
        raise RuntimeError("debug_rollout_only builds no trainer: no warm start (validation requires warmstart.steps=0)")

    def end_warm_start(self) -> None:
        pass

    def freeze_reference(self) -> None:
        pass

    def named_weights(self) -> InProcessWeights:
        return InProcessWeights(lambda: ())

    def save_hf(self, path: str, tokenizer) -> None:
        pass  # no weights: nothing here could be resumed as a trained model

    def state_dict(self) -> dict:
        return dict(MARKER)

    def load_state_dict(self, state: dict) -> None:
        pass  # a real run's trainer state: a rollout-only run generates from its weights and trains nothing

    def save_checkpoint(self, path: str) -> None:
        pass  # the state holds MARKER: nothing of a trainer to write

    def load_checkpoint(self, path: str) -> None:
        pass

    def release_memory(self) -> dict[str, float]:
        return {}  # nothing held

    def resume_memory(self) -> None:
        pass
