"""Samples -> TrainBatch (padding and masks). The only place token lists become tensors."""

from __future__ import annotations

import torch

from slime_hydra.training.base import TrainBatch
from slime_hydra.types import Sample


def collate(samples: list[Sample], advantages: torch.Tensor, pad_id: int) -> TrainBatch:
    """advantages: [N] per sample (broadcast to response tokens) or [N, T] per token."""
    n = len(samples)
    t1 = max(len(s.tokens) for s in samples)  # T + 1
    ids = torch.full((n, t1), pad_id, dtype=torch.long)
    attn = torch.zeros((n, t1), dtype=torch.long)
    mask = torch.zeros((n, t1 - 1), dtype=torch.float32)
    rlp = torch.zeros((n, t1 - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        L, R = len(s.tokens), s.response_length
        ids[i, :L] = torch.tensor(s.tokens)
        attn[i, :L] = 1
        lm = s.loss_mask if s.loss_mask is not None else [1] * R
        mask[i, L - 1 - R : L - 1] = torch.tensor(lm, dtype=torch.float32)  # position t predicts token t+1
        if s.rollout_log_probs is not None:
            rlp[i, L - 1 - R : L - 1] = torch.tensor(s.rollout_log_probs, dtype=torch.float32)
    adv = advantages[:, None] * mask if advantages.dim() == 1 else advantages
    return TrainBatch(ids, attn, mask, adv.float(), rlp)
